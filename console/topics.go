package console

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// maxTopicQueues is the most queues a topic has (the registry's limit,
// created or grown): more is refused here before anything is asked.
const maxTopicQueues = 4096

// maxCreateGroups bounds the broker groups a creation form may name.
const maxCreateGroups = 256

// topicsData is the topics page's: a page of the topics.
type topicsData struct {
	Topics    []topicRow
	Pager     pager
	Filter    string
	MayCreate bool
	CSRF      string
}

type topicRow struct {
	Name   string
	Queues int
	Groups []string
}

func topicsPage(q *query) (any, error) {
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	topics, err := q.meta().Topics(q.ctx)
	release()
	if err != nil {
		return nil, err
	}
	sort.Slice(topics, func(i, j int) bool { return topics[i].Name < topics[j].Name })
	shown, p, err := pageOf(q, topics, func(t routing.Topic) string { return t.Name })
	if err != nil {
		return nil, err
	}
	d := topicsData{Pager: p, Filter: q.r.URL.Query().Get("q"), CSRF: q.s.csrf,
		MayCreate: q.allow(protocol.CodeAdminCreateTopic, auth.Target{}) == nil}
	for _, t := range shown {
		d.Topics = append(d.Topics, topicRow{Name: t.Name, Queues: len(t.Queues), Groups: distinct(t.Queues)})
	}
	return d, nil
}

// distinct is the names in ss, sorted, each once.
func distinct(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// topicParam reads a topic's name from the values' field name: required,
// and a name the cluster takes.
func topicParam(v url.Values, name string) (string, error) {
	t := v.Get(name)
	if t == "" {
		return "", bad("say which topic (%s)", name)
	}
	if err := protocol.ValidateTopic(t); err != nil {
		return "", bad("%v", err)
	}
	return t, nil
}

// createTopic is the topics page's form: a topic with its queues spread
// over the groups named (every writable group when none), as 'ferryctl
// topic create' does.
func createTopic(q *query) (string, error) {
	f := q.r.PostForm
	name := f.Get("name")
	if err := protocol.ValidateNewTopic(name); err != nil {
		return "", bad("%v", err)
	}
	if err := q.allow(protocol.CodeAdminCreateTopic, auth.Topic(name)); err != nil {
		return "", err
	}
	queues, err := intParam(f, "queues", 8, 1, maxTopicQueues)
	if err != nil {
		return "", err
	}
	var groups []string
	for _, g := range strings.Split(f.Get("groups"), ",") {
		if g = strings.TrimSpace(g); g == "" {
			continue
		}
		if err := protocol.ValidateServerName("broker group name", g); err != nil {
			return "", bad("%v", err)
		}
		if groups = append(groups, g); len(groups) > maxCreateGroups {
			return "", bad("name at most %d groups", maxCreateGroups)
		}
	}
	release, err := q.slot()
	if err != nil {
		return "", err
	}
	defer release()
	if _, err := q.meta().CreateTopic(q.ctx, api.CreateTopicRequest{Name: name, Queues: queues, Groups: groups}); err != nil {
		return "", unknownIsBad(err)
	}
	return link("topic", "name", name), nil
}

// topicData is one topic's page: its queues (a page of them) with their
// groups and brokers, and, for who may count its messages, each queue's
// log range from its broker.
type topicData struct {
	Name    string
	Version uint64
	Queues  []queueRow
	Pager   pager
	// Ranges: the log ranges were asked (the principal may count the
	// topic's messages: describe, or consume on it); else the page says
	// what it would take.
	Ranges    bool
	MayAdd    bool
	CSRF      string
	MaxQueues int
}

type queueRow struct {
	routing.QueueRoute
	Start, End int64 // the log range, when read
	Held       int64 // End - Start
	Error      string
}

func topicPage(q *query) (any, error) {
	name, err := topicParam(q.r.URL.Query(), "name")
	if err != nil {
		return nil, err
	}
	if err := q.allow(protocol.CodeRouteGet, auth.Topic(name)); err != nil {
		return nil, err
	}
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	route, err := q.routes().RouteExisting(q.ctx, name)
	release()
	if err != nil {
		return nil, unknownIsBad(err)
	}
	shown, p, err := pageOf(q, route.Queues, func(qr routing.QueueRoute) string { return fmt.Sprint(qr.Queue, " ", qr.Group) })
	if err != nil {
		return nil, err
	}
	d := topicData{Name: name, Version: route.Version, Pager: p, CSRF: q.s.csrf, MaxQueues: maxTopicQueues,
		Ranges: q.allow(protocol.CodeQueueCount, auth.Topic(name)) == nil,
		MayAdd: q.allow(protocol.CodeAdminAddQueues, auth.Topic(name)) == nil}
	d.Queues = make([]queueRow, len(shown))
	for i, qr := range shown {
		d.Queues[i] = queueRow{QueueRoute: qr, Start: -1, End: -1, Held: -1}
	}
	if d.Ranges {
		bs := q.brokers()
		defer bs.close()
		readRanges(bs, name, d.Queues)
	}
	return d, nil
}

// readRanges reads each queue's log range from its broker, a call slot
// each, and notes the error of a queue it could not read.
func readRanges(bs *brokers, topic string, rows []queueRow) {
	var wg sync.WaitGroup
	for i := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &rows[i]
			lo, hi, err := bs.queueRange(topic, r.QueueRoute)
			if err != nil {
				r.Error = err.Error()
				return
			}
			r.Start, r.End, r.Held = lo, hi, hi-lo
		}()
	}
	wg.Wait()
}

// addQueues is a topic page's form: more queues, spread over the writable
// groups, as 'ferryctl topic add-queues' does.
func addQueues(q *query) (string, error) {
	f := q.r.PostForm
	name, err := topicParam(f, "name")
	if err != nil {
		return "", err
	}
	if err := q.allow(protocol.CodeAdminAddQueues, auth.Topic(name)); err != nil {
		return "", err
	}
	count, err := intParam(f, "count", 0, 1, maxTopicQueues)
	if err != nil {
		return "", err
	}
	if count == 0 {
		return "", bad("say how many queues to add (count)")
	}
	release, err := q.slot()
	if err != nil {
		return "", err
	}
	defer release()
	if _, err := q.meta().AddQueues(q.ctx, name, count); err != nil {
		return "", unknownIsBad(err)
	}
	return link("topic", "name", name), nil
}
