package metaserver

import "github.com/hashicorp/go-hclog"

// stoppingLogger is raft's logger: as it is until stop is closed (the node
// is stopping), then raft's errors are logged at INFO with stopping=true.
// When the metaservers stop together, the last ones to go see their peers
// gone (failed heartbeats, appends, votes) before their own raft stops:
// that is the stop, not a fault, and a clean stop logs no ERROR.
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

func (l *stoppingLogger) Error(msg string, args ...any) {
	if l.stopping() {
		l.Logger.Info(msg, append(args, "stopping", true)...)
		return
	}
	l.Logger.Error(msg, args...)
}

func (l *stoppingLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Error && l.stopping() {
		l.Logger.Log(hclog.Info, msg, append(args, "stopping", true)...)
		return
	}
	l.Logger.Log(level, msg, args...)
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
