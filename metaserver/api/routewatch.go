package api

// RouteWatch is a broker's long poll (ROUTE_WATCH) for the topics routed to
// its group: the metaserver leader answers it as soon as a topic with a
// queue on Group was created or grew after Version, or after WaitMillis
// with nothing. The broker asks again at once with the answer's Version,
// which tells the leader what the broker has taken in: a topic creation
// (or queue addition) is answered only once the brokers of its groups have
// it (DESIGN.md, "Route push").
type RouteWatch struct {
	Group    string `json:"group"`
	BrokerID string `json:"broker_id"`
	// Version is the registry version through which the broker has taken
	// in every change of its group's topics, from this leader's or an
	// earlier one's answers; 0: none (the broker just started).
	Version uint64 `json:"version"`
	// WaitMillis is how long the leader may hold the request when it has
	// nothing newer (at most 30 s; 0 answers at once).
	WaitMillis int64 `json:"wait_ms"`
}

// RouteWatchReply carries the topics routed to the watcher's group that
// changed after the watch's Version.
type RouteWatchReply struct {
	// Version is the registry version the answer is complete through: the
	// broker asks again with it.
	Version uint64 `json:"version"`
	// Topics are the topics with a queue on the group created or grown
	// after the watch's Version, oldest change first.
	Topics []PushedTopic `json:"topics,omitempty"`
	// Partial is set when older changes were left out (the broker had seen
	// none, or there were too many for one answer): Topics are the newest.
	// A topic the broker still does not know it looks up on its first send,
	// as it would without a push.
	Partial bool `json:"partial,omitempty"`
}

// PushedTopic is one topic's queues as a broker of one group needs them.
type PushedTopic struct {
	Name string `json:"name"`
	// Queues is the topic's queue count.
	Queues uint32 `json:"queues"`
	// Mine are the queues routed to the watcher's group, ascending.
	Mine []uint32 `json:"mine"`
}
