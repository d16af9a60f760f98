package metaserver

import (
	"strings"

	"github.com/hashicorp/go-hclog"
)

// stoppingLogger is raft's logger: as it is, except that raft's errors
// about reaching a peer (failed heartbeats, appends, votes) are WARN (a
// peer down is a condition the cluster rides out, and raft repeats them
// with every backoff), and that once stop is closed (the node is stopping)
// raft's errors are logged at INFO with stopping=true. When the metaservers
// stop together, each sees its peers go (even before its own signal
// arrives) before its own raft stops: that is the stop, not a fault, and a
// clean stop logs no ERROR.
type stoppingLogger struct {
	hclog.Logger
	stop <-chan struct{}
}

// quietWhenStopping wraps l as a stoppingLogger.
func quietWhenStopping(l hclog.Logger, stop <-chan struct{}) hclog.Logger {
	return &stoppingLogger{Logger: l, stop: stop}
}

func (l *stoppingLogger) stopping() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// peerFailures are the beginnings of raft's errors about reaching a peer.
var peerFailures = []string{"failed to heartbeat to", "failed to appendEntries to", "failed to make requestVote RPC",
	"failed to contact", "failed to pipeline appendEntries"}

func (l *stoppingLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *stoppingLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Error {
		switch {
		case l.stopping():
			level, args = hclog.Info, append(args, "stopping", true)
		case hasAnyPrefix(peerFailures, msg):
			level = hclog.Warn
		}
	}
	l.Logger.Log(level, msg, args...)
}

func hasAnyPrefix(prefixes []string, s string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func (l *stoppingLogger) With(args ...any) hclog.Logger {
	return &stoppingLogger{Logger: l.Logger.With(args...), stop: l.stop}
}

func (l *stoppingLogger) Named(name string) hclog.Logger {
	return &stoppingLogger{Logger: l.Logger.Named(name), stop: l.stop}
}

func (l *stoppingLogger) ResetNamed(name string) hclog.Logger {
	return &stoppingLogger{Logger: l.Logger.ResetNamed(name), stop: l.stop}
}
