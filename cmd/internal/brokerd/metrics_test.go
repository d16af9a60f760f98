package brokerd

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/cmd/internal/cli"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testmetrics"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// masterOnly are the gauges that mean something only on a master.
var masterOnly = []string{"ferrymq_broker_slave_lag_bytes", "ferrymq_broker_slave_lag_seconds", "ferrymq_broker_slave_connected",
	"ferrymq_broker_replica_lag_bytes", "ferrymq_broker_replica_lag_seconds", "ferrymq_broker_replica_in_sync", "ferrymq_broker_takes_high"}

// TestMetricsFollowTheRole: the master exports ferrymq_broker_role
// {role="master"} and the slave gauges; its slave exports
// ferrymq_broker_role{role="slave"} and none of them, so an alert on slave
// lag cannot fire on a slave. SEND requests are observed once each in the
// send histogram, syncs in the flush histogram, the queues' end offsets and
// the data directory's file system are exported.
func TestMetricsFollowTheRole(t *testing.T) {
	meta := testcluster.StartMeta(t, 1, testcluster.SteadyMeta)
	g := testcluster.StartGroup(t, meta.Addrs(), "g1", testcluster.GroupOpts{Slave: true, Edit: func(c *broker.Config) {
		testcluster.SteadyBroker(c)
		c.Flush = storage.FlushSync
	}})
	meta.CreateTopic(t, "measured", "g1", "g1")
	master, slave := cli.NewMetrics(), cli.NewMetrics()
	register(master, g.Master, g.MasterDir)
	register(slave, g.Slave, g.SlaveDir)
	testwait.For(t, 10*time.Second, "the slave to follow its master", func() bool { return g.Slave.Role().Kind == broker.RoleSlave })

	roleOf := func(name string, fams map[string]*dto.MetricFamily) string {
		t.Helper()
		f := fams["ferrymq_broker_role"]
		if f == nil || len(f.Metric) != 1 || f.Metric[0].GetGauge().GetValue() != 1 {
			t.Fatalf("%s: ferrymq_broker_role is %v; want one series valued 1", name, f)
		}
		return testmetrics.Labels(f.Metric[0])["role"]
	}
	mf, sf := testmetrics.Gather(t, master.Registry), testmetrics.Gather(t, slave.Registry)
	if r := roleOf("master", mf); r != "master" {
		t.Errorf("the master exports role %q", r)
	}
	if r := roleOf("slave", sf); r != "slave" {
		t.Errorf("the slave exports role %q", r)
	}
	for _, name := range masterOnly {
		if mf[name] == nil {
			t.Errorf("the master does not export %s", name)
		}
		if sf[name] != nil {
			t.Errorf("the slave exports the master-only %s: %v", name, sf[name].Metric)
		}
	}
	if v := mf["ferrymq_broker_slave_connected"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("the master's slave_connected is %v with its slave connected", v)
	}
	if v := mf["ferrymq_broker_takes_high"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("the master's takes_high is %v with its slave in the sync set", v)
	}
	if m := mf["ferrymq_broker_replica_in_sync"].GetMetric(); len(m) != 1 || testmetrics.Labels(m[0])["replica"] != g.Slave.ID() || m[0].GetGauge().GetValue() != 1 {
		t.Errorf("the master's replica_in_sync: %v, want one series for %s valued 1", m, g.Slave.ID())
	}

	histCount := func(name string) uint64 {
		t.Helper()
		f := testmetrics.Gather(t, master.Registry)[name]
		if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("%s: %v, want a histogram", name, f)
		}
		return f.Metric[0].GetHistogram().GetSampleCount()
	}
	c := testcluster.Dial(t, g.Master.Addr())
	// A fresh topic is NO_ROUTE until the broker has looked it up: one
	// message in each queue once it has.
	for q := range uint32(2) {
		testwait.For(t, 10*time.Second, "the broker to know the topic", func() bool {
			return testcluster.Send(t, c, []protocol.Message{testcluster.Msg("measured", q, protocol.Normal, "warm")})[0].Status == protocol.StatusOK
		})
	}
	sends, flushes := histCount("ferrymq_broker_send_duration_seconds"), histCount("ferrymq_broker_flush_duration_seconds")
	for i := range 3 {
		// Two messages per request: the histogram counts requests.
		res := testcluster.Send(t, c, []protocol.Message{
			testcluster.Msg("measured", uint32(i%2), protocol.Normal, "a"), testcluster.Msg("measured", uint32(i%2), protocol.Normal, "b")})
		for _, r := range res {
			if r.Status != protocol.StatusOK {
				t.Fatalf("send: %v", r.Status)
			}
		}
	}
	if n := histCount("ferrymq_broker_send_duration_seconds") - sends; n != 3 {
		t.Errorf("3 SEND requests of 2 messages made %d observations of the send histogram, want 3", n)
	}
	if n := histCount("ferrymq_broker_flush_duration_seconds") - flushes; n < 1 {
		t.Errorf("3 SEND requests with -flush sync made %d syncs", n)
	}

	ends := map[string]float64{}
	for _, m := range testmetrics.Gather(t, master.Registry)["ferrymq_broker_queue_end_offset"].GetMetric() {
		l := testmetrics.Labels(m)
		ends[l["topic"]+"/"+l["queue"]] = m.GetGauge().GetValue()
	}
	if ends["measured/0"] != 5 || ends["measured/1"] != 3 {
		t.Errorf("queue end offsets %v, want measured/0 at 5 and measured/1 at 3", ends)
	}

	mf = testmetrics.Gather(t, master.Registry)
	avail, size := mf["ferrymq_broker_disk_avail_bytes"], mf["ferrymq_broker_disk_size_bytes"]
	if avail == nil || size == nil {
		t.Fatalf("no disk gauges: %v %v", avail, size)
	}
	if a, s := avail.Metric[0].GetGauge().GetValue(), size.Metric[0].GetGauge().GetValue(); s <= 0 || a < 0 || a > s {
		t.Errorf("disk: %v bytes free of %v", a, s)
	}
}
