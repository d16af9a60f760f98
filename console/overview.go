package console

import (
	"sort"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// allPages lists the console's pages, in the navigation's order.
func allPages() []*page {
	return []*page{
		{path: "/", title: "Overview", code: protocol.CodeAdminGroups, tmpl: "overview", get: overview},
		{path: "/groups", title: "Broker groups", code: protocol.CodeAdminGroups, tmpl: "groups", get: groupsPage, act: setGroupMode},
		{path: "/topics", title: "Topics", code: protocol.CodeAdminTopics, tmpl: "topics", get: topicsPage, act: createTopic},
		{path: "/topic", heading: "Topic", code: protocol.CodeRouteGet, tmpl: "topic", get: topicPage, act: addQueues},
		{path: "/consumers", title: "Consumer groups", code: protocol.CodeConsumerGroups, tmpl: "consumers", get: consumersPage},
		{path: "/consumer", heading: "Consumer group", code: protocol.CodeConsumerGroups, tmpl: "consumer", get: consumerPage, act: confirmReset},
		// Describe, or consume on some topic (QUEUE_COUNT's rule): see messages.go.
		{path: "/messages", title: "Messages", code: protocol.CodeQueueCount, tmpl: "messages", get: messages, brokers: true},
		{path: "/deadletters", title: "Dead letters", code: protocol.CodeQueueCount, tmpl: "deadletters", get: deadLetters, act: resendDeadLetters, brokers: true},
		{path: "/delayed", title: "Delayed", code: protocol.CodeDelayedState, tmpl: "delayed", get: delayed, act: cancelDelayed, brokers: true},
		// Describe: the groups to ask are listed by ADMIN_GROUPS (see txns.go).
		{path: "/txns", title: "Transactions", code: protocol.CodeAdminGroups, tmpl: "txns", get: txns, act: abortTxn, brokers: true},
		{path: "/principals", title: "Principals", code: protocol.CodeAdminACLList, tmpl: "principals", get: principalsPage},
		{path: "/audit", title: "Audit", code: protocol.CodeAuditList, tmpl: "audit", get: auditPage},
	}
}

// overviewData is the overview page's: the metaservers, and each broker
// group's state and recent epochs.
type overviewData struct {
	Meta      api.MetaStatus
	MetaError string // why the metaservers' status is not shown
	Groups    []api.GroupInfo
	Writable  int
	// Charts are the broker groups' bytes stored a second, and the lag
	// of the consumer groups the principal may see (the first few).
	Charts []chart
}

// overviewLagCharts bounds the consumer groups' lag charts on the overview.
const overviewLagCharts = 12

// memberWait bounds how long the overview waits for each metaserver's own
// answer about itself.
const memberWait = 500 * time.Millisecond

func overview(q *query) (any, error) {
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	defer release()
	var d overviewData
	if err := q.allow(protocol.CodeAdminRaftStatus, auth.Target{}); err == nil {
		if d.Meta, err = q.meta().MetaStatus(q.ctx, memberWait); err != nil {
			d.MetaError = err.Error()
		}
	}
	if d.Groups, err = q.meta().Groups(q.ctx); err != nil {
		return nil, err
	}
	sort.Slice(d.Groups, func(i, j int) bool { return d.Groups[i].Name < d.Groups[j].Name })
	names := make([]string, len(d.Groups))
	for i, g := range d.Groups {
		if g.State == "RW" {
			d.Writable++
		}
		names[i] = g.Name
	}
	d.Charts = append(q.groupCharts(names), q.lagCharts(q.c.sampledLagGroups(overviewLagCharts))...)
	return d, nil
}
