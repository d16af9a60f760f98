package prom

// LatencyBuckets are the send histogram's bucket bounds, for the external tests.
var LatencyBuckets = latencyBuckets
