package fsm

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// TestNameErrorsNameTheCharacter: a refused producer, consumer group or
// member name (or topic) says, through the FSM's answer, which character is
// wrong as the user typed it and where, not a byte of it read as Latin-1.
func TestNameErrorsNameTheCharacter(t *testing.T) {
	f := seeded(t)
	for _, c := range []struct {
		cmd  Command
		want string
	}{
		{&InitProducer{Name: "naïve"}, `producer name "naïve": character 'ï' (U+00EF) at position 3 is not allowed; a producer name may contain letters a-z A-Z, digits 0-9, '.', '_' and '-'`},
		{&JoinGroup{Group: "Abrechnung-ü", Member: "m1", Topics: []string{"orders"}}, `consumer group name "Abrechnung-ü": character 'ü' (U+00FC) at position 12 is not allowed`},
		// Commands are JSON, which carries bytes that are not UTF-8 as U+FFFD.
		{&JoinGroup{Group: "billing", Member: "m\xe91", Topics: []string{"orders"}}, "member name \"m\ufffd1\": character '\ufffd' (U+FFFD, the replacement character: the name held bytes that are not UTF-8) at position 2"},
		{&JoinGroup{Group: "", Member: "m1", Topics: []string{"orders"}}, `consumer group name is empty; a consumer group name must be 1 to 255 bytes`},
		{&CreateTopic{Name: "主题-ü", Queues: []string{"g1"}}, `topic name "主题-ü": character '主' (U+4E3B) at position 1 is not allowed`},
	} {
		_, err := apply(t, f, c.cmd)
		if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%T: %v, want INVALID saying %s", c.cmd, err, c.want)
		}
		if err != nil && strings.Count(err.Error(), "INVALID") != 1 {
			t.Errorf("%T: %q names INVALID more than once", c.cmd, err)
		}
	}
}

// TestNameRulesUnchanged: the FSM refuses exactly the names it refused when
// it checked them byte by byte, so a log written before replays the same.
func TestNameRulesUnchanged(t *testing.T) {
	byteRule := func(name string, maxLen int, empty bool) bool {
		if name == "" {
			return empty
		}
		if len(name) > maxLen {
			return false
		}
		for i := 0; i < len(name); i++ {
			c := name[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	names := []string{"", "ü", "主题", "\xff", "a\xc3", "\u00a0", "\ufffd", strings.Repeat("n", 255), strings.Repeat("n", 256)}
	for b := range 256 {
		names = append(names, "a"+string([]byte{byte(b)})+"z", string([]byte{byte(b)}))
	}
	for _, n := range names {
		if got, want := ValidateProducerName(n) == nil, byteRule(n, MaxProducerName, true); got != want {
			t.Errorf("producer name %q: allowed %v, was %v", n, got, want)
		}
		if got, want := ValidateConsumerName("group", n) == nil, byteRule(n, MaxConsumerName, false); got != want {
			t.Errorf("group name %q: allowed %v, was %v", n, got, want)
		}
	}
}
