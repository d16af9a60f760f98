package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

func newBrokersCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "brokers",
		Short: "List the broker groups: members, epoch, state and reasons, heartbeats, lag, idempotent producers and duplicates absorbed, HIGH copies, admission (admitted, PENDING, retired), then every slave (in the sync set, acknowledged, lag), each group's epoch history and failover word",
		Args:  usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			groups, err := cl.Groups(ctx)
			if err != nil {
				return err
			}
			var rows [][]string
			for _, gi := range groups {
				reason, state, high := gi.Reason, gi.State, highWord(gi.Group)
				if reason == "" {
					reason = "-"
				}
				if gi.Admission == routing.Retired {
					state, high = "-", "-" // no brokers: neither takes writes nor refuses them
				}
				rows = append(rows, []string{gi.Name, fmt.Sprint(gi.Epoch), state, reason, member(gi.Master.ID, gi.Master.Addr), member(gi.Slave.ID, gi.Slave.Addr),
					heartbeat(gi, gi.Master.ID, gi.MasterHeartbeatAgeMillis), heartbeat(gi, gi.Slave.ID, gi.SlaveHeartbeatAgeMillis), fmt.Sprint(gi.Last.LagBytes),
					(time.Duration(gi.Last.LagMillis) * time.Millisecond).String(), fmt.Sprint(gi.Holders),
					fmt.Sprint(gi.Last.Producers), fmt.Sprint(gi.Last.Duplicates), high, admissionWord(gi.Admission)})
			}
			// Below the groups: every slave, with what its master last
			// reported of it.
			var slaves [][]string
			for _, gi := range groups {
				for _, m := range gi.Members {
					if m.Role == string(routing.RoleSlave) {
						slaves = append(slaves, slaveRow(gi, m))
					}
				}
			}
			if len(slaves) > 0 {
				rows = append(rows, []string{""}, []string{"GROUP", "SLAVE", "IN-SYNC", "ACKED", "LAG-BYTES", "LAG-TIME", "SLAVE-HB", "PROMOTABLE"})
				rows = append(rows, slaves...)
			}
			if groups == nil {
				groups = []api.GroupInfo{}
			}
			// Below the table: each group's epochs (who led, from which log
			// offset) and the leader's word on failover.
			var notes [][]string
			for _, gi := range groups {
				var epochs []string
				for _, e := range gi.History {
					unconfirmed := ""
					if !e.Fixed {
						unconfirmed = "?" // its master has not confirmed the start yet
					}
					epochs = append(epochs, fmt.Sprintf("%d:%s@%d%s", e.Epoch, e.Master, e.Start, unconfirmed))
				}
				if len(epochs) > 0 {
					notes = append(notes, []string{gi.Name + " epochs:", strings.Join(epochs, " ")})
				}
				for _, m := range gi.Members {
					switch {
					case m.Role != string(routing.RoleSlave):
					case m.Broken != "":
						notes = append(notes, []string{gi.Name + " slave broken:", m.ID + ": " + m.Broken})
					case m.Waiting != "":
						notes = append(notes, []string{gi.Name + " slave waiting:", m.ID + ": " + m.Waiting})
					}
				}
				if o := gi.Resync; o != nil {
					notes = append(notes, []string{gi.Name + " resync:", fmt.Sprintf("#%d ordered for %s, not carried out yet", o.Seq, o.Broker)})
				}
				for _, m := range gi.Members {
					if m.Role == api.RoleFormerMaster {
						notes = append(notes, []string{gi.Name + " former master:", formerMaster(gi, m)})
					}
				}
				if gi.Failover != "" {
					notes = append(notes, []string{gi.Name + " failover:", gi.Failover})
				}
				switch gi.Admission {
				case routing.Pending:
					notes = append(notes, []string{gi.Name + " pending:", fmt.Sprintf("registered but not admitted: it gets no queue until 'ferryctl broker add-group %s' (or retire it: 'ferryctl broker retire-group %s')", gi.Name, gi.Name)})
				case routing.Retired:
					notes = append(notes, []string{gi.Name + " retired:", fmt.Sprintf("its queues moved to other groups; its brokers are refused until 'ferryctl broker add-group %s'", gi.Name)})
				}
			}
			if len(notes) > 0 && len(rows) > 0 {
				rows = append(rows, []string{""})
				rows = append(rows, notes...)
			}
			return g.printer().print(groups, []string{"GROUP", "EPOCH", "STATE", "REASONS", "MASTER", "SLAVE", "MASTER-HB", "SLAVE-HB", "LAG-BYTES", "LAG-TIME", "QUEUES", "PRODUCERS", "DUPLICATES", "HIGH", "ADMISSION"}, rows)
		}),
	}
}

// slaveRow is one slave of gi in the brokers table: whether it is in the
// sync set, what its master last reported of it ("-" when it has not), its
// last heartbeat, and whether a failover could promote it now (else the
// reason's word).
func slaveRow(gi api.GroupInfo, m api.BrokerStatus) []string {
	inSync := "no"
	if m.InSync {
		inSync = "yes"
	}
	acked, lagBytes, lagTime := "-", "-", "-"
	if m.Reported {
		acked, lagBytes, lagTime = fmt.Sprint(m.AckOffset), fmt.Sprint(m.LagBytes), duration(m.LagMillis)
	}
	eligible := "yes"
	if !m.Eligible {
		eligible = "no: " + orDash(m.IneligibleReason)
	}
	return []string{gi.Name, member(m.ID, m.Addr), inSync, acked, lagBytes, lagTime, heartbeatOf(gi, m), eligible}
}

// resyncOut is what 'broker resync' prints with --json.
type resyncOut struct {
	Group  string `json:"group"`
	Broker string `json:"broker"`
	Seq    uint64 `json:"seq"`
}

// admissionWord is a group's admission in the brokers table: PENDING in
// capitals, as it is the one an operator must act on.
func admissionWord(a routing.Admission) string {
	if a == routing.Pending {
		return "PENDING"
	}
	return a.Word()
}

// member is a broker as "id (addr)", or "-".
func member(id, addr string) string {
	if id == "" {
		return "-"
	}
	return id + " (" + addr + ")"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age is how long ago something happened ms milliseconds ago, to the
// millisecond under a second and to the tenth of a second above.
func age(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return duration(ms) + " ago"
}

func duration(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	if d >= time.Second {
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}

// heartbeat is the last heartbeat of group member id as the leader knows
// it: its age, and DEAD once it is silent past the session; a member the
// leader has not heard since it took over says so, with how long ago that
// was (heartbeats live in the leader's memory only). "-" for no member;
// ms is the age to show when the leader does not list its members (one
// older than this ferryctl).
func heartbeat(gi api.GroupInfo, id string, ms int64) string {
	if id == "" {
		return "-"
	}
	for _, m := range gi.Members {
		if m.ID == id && m.Role != api.RoleFormerMaster {
			return heartbeatOf(gi, m)
		}
	}
	return age(ms)
}

func heartbeatOf(gi api.GroupInfo, m api.BrokerStatus) string {
	s := age(m.LastHeartbeatAgeMillis)
	if !m.Heard {
		s = "none since this leader took over " + age(gi.LeaderForMillis)
	}
	if m.Lost {
		s += " DEAD"
	}
	return s
}

// formerMaster describes a master a failover took out of the group.
func formerMaster(gi api.GroupInfo, m api.BrokerStatus) string {
	s := member(m.ID, m.Addr) + ", last heartbeat " + heartbeatOf(gi, m)
	if m.ReplacedBy != "" {
		s += fmt.Sprintf("; replaced by %s at epoch %d (it rejoins as the slave when it is back)", m.ReplacedBy, m.ReplacedAtEpoch)
	}
	return s
}

func newBrokerCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "broker", Short: "Change a broker group's state, admit a group, retire a dead one, set how many copies HIGH needs, remove a slave, or have a slave copy its log again"}
	cmd.AddCommand(newBrokerAddGroupCommand(g), newBrokerRetireGroupCommand(g), newBrokerSetGroupCommand(g), newBrokerRemoveSlaveCommand(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "resync BROKER-ID",
		Short: "Have a slave set its log aside (into its data directory's truncated/) and copy it again from its master",
		Long: `Have a slave set its log aside and copy it again from its master.

For a slave that cannot follow because of its own log: 'ferryctl brokers'
shows it broken, with the reason (its log is not a prefix of the master's,
or cannot be cut where the group's epoch history says). The broker, when its
next heartbeat carries the order, moves every record of its log into a side
file under its data directory's truncated/ (read it with 'ferryctl
truncated FILE'; delete it once you no longer need it: it takes as much
disk as the log did), and copies the master's log from its first offset.
The group's master cannot be resynced. Needs admin.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			grp, err := cl.ResyncBroker(ctx, args[0])
			if err != nil {
				return err
			}
			seq := grp.ResyncSeq()
			return g.printer().print(resyncOut{Group: grp.Name, Broker: args[0], Seq: seq},
				[]string{"GROUP", "BROKER", "ORDER"}, [][]string{{grp.Name, args[0], fmt.Sprintf("resync #%d: carried out at the broker's next heartbeat", seq)}})
		}),
	})
	for _, mode := range []struct {
		use      string
		readOnly bool
		short    string
	}{
		{"readonly", true, "Mark a group read-only (stays so until 'broker writable')"},
		{"writable", false, "Clear an admin's read-only mark"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   mode.use + " GROUP",
			Short: mode.short,
			Args:  usageArgs(cobra.ExactArgs(1)),
			RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
				grp, err := cl.SetGroupReadOnly(ctx, args[0], mode.readOnly)
				if err != nil {
					return err
				}
				reason := grp.Reasons.String()
				if reason == "" {
					reason = "-"
				}
				return g.printer().print(grp, []string{"GROUP", "STATE", "REASONS"}, [][]string{{grp.Name, grp.Reasons.State(), reason}})
			}),
		})
	}
	return cmd
}
