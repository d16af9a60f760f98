package loadgen

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

// ErrorCause is one cause of failed sends: what kind of failure the
// producer says it is (not delivered in time, metaserver unreachable...)
// and the status under it (READ_ONLY), or for an error that is neither,
// its text.
type ErrorCause struct {
	Cause   string `json:"cause"`
	Count   int64  `json:"count"`
	Example string `json:"example"` // the first error of this cause
}

// sendErrors groups failed sends by cause.
type sendErrors struct {
	mu     sync.Mutex
	causes map[string]*ErrorCause
	order  []string // first seen first
}

// producerKinds are the producer's kinds of failure, as a cause names
// them, outermost first: a delivery timeout wraps its last attempt's
// cause, such as an unreachable metaserver.
var producerKinds = []struct {
	err  error
	name string
}{
	{producer.ErrDeliveryTimeout, "not delivered in time"},
	{producer.ErrClosed, "producer closed"},
	{producer.ErrFenced, "producer fenced"},
	{producer.ErrBufferFull, "buffer full"},
	{producer.ErrUnreachable, "metaserver unreachable"},
	{producer.ErrConnLost, "connection to broker lost"},
	{context.DeadlineExceeded, "deadline exceeded"},
	{context.Canceled, "canceled"},
}

// causeOf is the cause err is counted under: the producer's kinds of
// failure it matches and the innermost status it carries, such as "not
// delivered in time: READ_ONLY"; the error's text only when it has
// neither. A message id, an attempt count or an address in the text does
// not make a cause of its own.
func causeOf(err error) string {
	var parts []string
	for _, k := range producerKinds {
		if errors.Is(err, k.err) {
			parts = append(parts, k.name)
		}
	}
	if pe := innermostStatus(err); pe != nil {
		parts = append(parts, pe.Status.String())
	}
	if len(parts) == 0 {
		return err.Error()
	}
	return strings.Join(parts, ": ")
}

// innermostStatus returns the deepest *protocol.Error in err's tree (the
// first found among equally deep ones), nil if there is none.
func innermostStatus(err error) *protocol.Error {
	var found *protocol.Error
	best := -1
	var walk func(e error, depth int)
	walk = func(e error, depth int) {
		if pe, ok := e.(*protocol.Error); ok && depth > best {
			found, best = pe, depth
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if n := u.Unwrap(); n != nil {
				walk(n, depth+1)
			}
		case interface{ Unwrap() []error }:
			for _, n := range u.Unwrap() {
				if n != nil {
					walk(n, depth+1)
				}
			}
		}
	}
	walk(err, 0)
	return found
}

func (s *sendErrors) add(err error) {
	cause := causeOf(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.causes == nil {
		s.causes = map[string]*ErrorCause{}
	}
	c := s.causes[cause]
	if c == nil {
		c = &ErrorCause{Cause: cause, Example: err.Error()}
		s.causes[cause] = c
		s.order = append(s.order, cause)
	}
	c.Count++
}

// list returns the causes, most frequent first (first seen first among
// equals).
func (s *sendErrors) list() []ErrorCause {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ErrorCause, 0, len(s.order))
	for _, k := range s.order {
		out = append(out, *s.causes[k])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	return out
}
