package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// roleLog is the part of the commit log that role changes use.
type roleLog interface {
	masterLog
	slaveLog
	Truncate(offset int64, sideFile string) (storage.TruncateResult, error)
}

// roles makes the broker what the registry says it is. It runs on one
// goroutine and takes the group from every accepted heartbeat reply (the
// latest one wins); it is the only place that starts or stops replication
// and the follower, and the only writer of the broker's local epoch.
//
// Becoming the master of epoch E: stop the follower (so the log stops
// growing from the old master), write E to disk, start replication, then
// mark E ready in the write lease. Becoming the slave in epoch E: stop
// replication (HIGH messages still waiting are answered LEASE_LOST), cut
// the log back to where the first epoch after the broker's own began (the
// cut records go to a side file), write E to disk, and follow the master.
//
// The local epoch ("epoch" in the data directory) is the last epoch whose
// records this broker's log holds, as master or as slave. Comparing it
// with the registry's epoch history tells a broker that comes back where
// its log may have left the group's.
type roles struct {
	id        string
	dir       string
	log       roleLog
	lease     *writeLease
	clock     clockwork.Clock
	lg        hclog.Logger
	stats     *Stats
	newRepl   func() *replication
	newFollow func(epoch uint32, masterHA string, masterEnd *atomic.Int64) *follower
	fixedHA   string // a configured master HA address, "" to take the registry's
	// releasePulls answers every parked PULL (step-down, truncation); may be nil.
	releasePulls func()

	want chan routing.Group // capacity 1: the latest group

	repl      atomic.Pointer[replication] // while master
	replStop  func()
	follow    *follower // while slave
	followEnd func()
	epoch     atomic.Uint32 // the local epoch
	masterEnd atomic.Int64  // the master's log end in the follower's last answer
	// takeoverEnd is the log end when the broker took over its epoch as
	// master (-1 while it is not master); lastCut is its last truncation.
	takeoverEnd atomic.Int64
	lastCut     atomic.Pointer[api.Cut]
	group       atomic.Pointer[routing.Group] // the registry's last word on the group
	state       atomic.Value                  // string: what the broker is now, for logs and tests
	blocked     string                        // why the broker does not follow, logged once
}

const epochFile = "epoch"

// sideDir holds the records cut by truncations.
const sideDir = "truncated"

func newRoles(r *roles) (*roles, error) {
	r.want = make(chan routing.Group, 1)
	r.state.Store("starting")
	r.takeoverEnd.Store(-1)
	e, err := readEpoch(r.dir)
	if err != nil {
		return nil, err
	}
	r.epoch.Store(e)
	return r, nil
}

// readEpoch reads the local epoch; a missing file is epoch 0.
func readEpoch(dir string) (uint32, error) {
	b, err := os.ReadFile(filepath.Join(dir, epochFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("broker: read the local epoch: %w", err)
	}
	e, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("broker: local epoch file %s: %w", filepath.Join(dir, epochFile), err)
	}
	return uint32(e), nil
}

// writeEpoch writes the local epoch durably: a temporary file, synced, renamed.
func writeEpoch(dir string, e uint32) error {
	path := filepath.Join(dir, epochFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.FormatUint(uint64(e), 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			_ = d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("broker: write the local epoch: %w", err)
	}
	return nil
}

// observe hands the latest group to run; it never blocks.
func (r *roles) observe(g routing.Group) {
	for {
		select {
		case r.want <- g:
			return
		default:
		}
		select {
		case <-r.want: // drop the older one
		default:
		}
	}
}

// replication returns the running replication, nil unless master.
func (r *roles) replication() *replication { return r.repl.Load() }

// State is what the broker is now: "starting", "master", "slave", or
// "blocked: why".
func (r *roles) State() string { s, _ := r.state.Load().(string); return s }

func (r *roles) run(ctx context.Context) {
	defer r.stopAll()
	for {
		select {
		case <-ctx.Done():
			return
		case g := <-r.want:
			r.reconcile(ctx, g)
		}
	}
}

func (r *roles) stopAll() {
	r.lease.ready.Store(0)
	r.stopReplication("the broker is shutting down")
	r.stopFollower()
}

// epochStart returns the log offset where the epoch after epoch began, by
// the registry's last word, and whether one did; known is false while the
// broker has no word from the registry yet and its own log is of a later
// epoch (it cannot tell where that epoch began).
func (r *roles) epochStart(epoch uint32) (start int64, ok, known bool) {
	g := r.group.Load()
	if g == nil {
		return 0, false, epoch >= r.epoch.Load()
	}
	if epoch >= g.Epoch {
		return 0, false, true
	}
	for _, e := range g.History {
		if e.Epoch == epoch+1 {
			return e.Start, true, true
		}
	}
	return 0, false, true // older than the history: not checked (DESIGN.md, known gaps)
}

// reconcile makes the broker what g says.
func (r *roles) reconcile(ctx context.Context, g routing.Group) {
	r.group.Store(&g)
	role, ok := g.RoleOf(r.id)
	if !ok || g.Epoch == 0 {
		return // the registry has not placed this broker (the heartbeat said why)
	}
	switch role {
	case routing.RoleMaster:
		r.becomeMaster(g)
	case routing.RoleSlave:
		r.becomeSlave(ctx, g)
	}
}

func (r *roles) becomeMaster(g routing.Group) {
	if rep := r.repl.Load(); rep != nil && r.lease.ready.Load() == g.Epoch {
		rep.setSlave(g.Slave.ID, g.Epoch)
		return
	}
	r.stopFollower()
	if r.epoch.Load() != g.Epoch {
		if err := writeEpoch(r.dir, g.Epoch); err != nil {
			r.lg.Error("cannot take over as master: the epoch is not on disk", "epoch", g.Epoch, "error", err)
			return
		}
		r.epoch.Store(g.Epoch)
	}
	rep := r.repl.Load()
	if rep == nil {
		rep = r.newRepl()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			rep.run(ctx)
		}()
		r.replStop = func() { cancel(); <-done }
		r.repl.Store(rep)
	}
	rep.setSlave(g.Slave.ID, g.Epoch)
	r.takeoverEnd.Store(r.log.EndOffset()) // the follower stopped: the log no longer grows but by this broker's writes
	r.lease.ready.Store(g.Epoch)
	r.state.Store(string(routing.RoleMaster))
	r.stats.Takeovers.Add(1)
	r.lg.Info("took over as master", "epoch", g.Epoch, "log-end", r.log.EndOffset(), "slave", g.Slave.ID)
}

func (r *roles) becomeSlave(ctx context.Context, g routing.Group) {
	if r.repl.Load() != nil {
		r.lease.ready.Store(0)
		r.takeoverEnd.Store(-1)
		r.stopReplication("the registry made this broker the slave")
		r.releaseParkedPulls()
		r.lg.Warn("stepped down: the registry names another master", "epoch", g.Epoch, "master", g.Master.ID)
	}
	if local := r.epoch.Load(); local < g.Epoch {
		r.stopFollower()
		led := local
		if led == 0 {
			led = g.LastLed(r.id) // a log from before local epochs were kept
		}
		off, cut, err := g.TruncationPoint(led)
		if err != nil {
			r.block(fmt.Sprintf("cannot tell where this log left the group's: %v; move the data directory away to copy afresh", err))
			return
		}
		if cut && off < r.log.EndOffset() {
			side := filepath.Join(r.dir, sideDir, storage.SideFileName(off, led))
			res, err := r.log.Truncate(off, side)
			if err != nil {
				r.block(fmt.Sprintf("cutting the log back to offset %d failed: %v", off, err))
				return
			}
			r.releaseParkedPulls() // a queue's next offset may have gone back under them
			r.stats.Truncations.Add(1)
			r.stats.TruncatedBytes.Add(res.To - res.From)
			r.lastCut.Store(&api.Cut{Epoch: g.Epoch, Bytes: res.To - res.From, Records: res.Records, SideFile: res.SideFile})
			r.lg.Warn("cut the log back to where the new master's epoch began; the cut records are kept for the operator",
				"from", res.From, "to", res.To, "records", res.Records, "side-file", res.SideFile,
				"led-epoch", led, "epoch", g.Epoch, "read-with", "ferryctl truncated "+res.SideFile)
		}
		if err := writeEpoch(r.dir, g.Epoch); err != nil {
			r.block(err.Error())
			return
		}
		r.epoch.Store(g.Epoch)
	}
	r.blocked = ""
	addr := r.fixedHA
	if addr == "" {
		addr = g.Master.HAAddr
	}
	if r.follow != nil && r.follow.epoch == g.Epoch && r.follow.addr == addr {
		return
	}
	r.stopFollower()
	if addr == "" {
		return
	}
	f := r.newFollow(g.Epoch, addr, &r.masterEnd)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(fctx)
	}()
	r.follow, r.followEnd = f, func() { cancel(); <-done }
	r.state.Store(string(routing.RoleSlave))
	r.lg.Info("following the master", "epoch", g.Epoch, "master", g.Master.ID, "ha-addr", addr, "log-end", r.log.EndOffset())
}

func (r *roles) block(why string) {
	if why != r.blocked {
		r.lg.Error("the broker does not follow its master", "why", why)
	}
	r.blocked = why
	r.state.Store("blocked: " + why)
}

func (r *roles) stopReplication(why string) {
	rep := r.repl.Load()
	if rep == nil {
		return
	}
	r.repl.Store(nil)
	rep.failWaiters(why, protocol.StatusLeaseLost)
	r.replStop()
	r.replStop = nil
}

func (r *roles) releaseParkedPulls() {
	if r.releasePulls != nil {
		r.releasePulls()
	}
}

func (r *roles) stopFollower() {
	if r.follow == nil {
		return
	}
	r.followEnd()
	r.follow, r.followEnd = nil, nil
}
