package fsm

import (
	"slices"
	"sort"

	"github.com/ferrymq/ferrymq/routing"
)

// TopicsChanged returns the registry version and, read at that version, the
// topics with a queue on group that were created or grew after version
// since (their Version is past it), oldest change first. At most limit of
// them are returned (limit <= 0: all), the newest; more reports that older
// ones were left out. The metaserver leader pushes them to the group's
// brokers (ROUTE_WATCH). It scans every topic, comparing versions, under the
// read lock, and copies only what it returns.
func (f *FSM) TopicsChanged(group string, since uint64, limit int) (version uint64, topics []routing.Topic, more bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var changed []*routing.Topic
	for _, t := range f.s.Topics {
		if t.Version > since && slices.Contains(t.Queues, group) {
			changed = append(changed, t)
		}
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].Version < changed[j].Version })
	if limit > 0 && len(changed) > limit {
		changed, more = changed[len(changed)-limit:], true
	}
	topics = make([]routing.Topic, len(changed))
	for i, t := range changed {
		topics[i] = routing.Topic{Name: t.Name, Queues: slices.Clone(t.Queues), Version: t.Version}
	}
	return f.s.Version, topics, more
}

// Topic returns a copy of a topic, and whether it exists.
func (f *FSM) Topic(name string) (routing.Topic, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	t := f.s.Topics[name]
	if t == nil {
		return routing.Topic{}, false
	}
	return routing.Topic{Name: t.Name, Queues: slices.Clone(t.Queues), Version: t.Version}, true
}
