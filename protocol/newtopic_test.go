package protocol

import (
	"strings"
	"testing"
)

// TestValidateNewTopic: a topic to be created has no name of dots alone
// and no '%' but in a dead-letter topic's prefix, %DLQ%GROUP, or a retry
// topic's, %RETRY%GROUP; each refusal
// says why.
func TestValidateNewTopic(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"..", "only dots"},
		{".", "only dots"},
		{"%", "reserved for the system's topics"},
		{"a%b", "reserved"},
		{"%DLQ%", "reserved"},
		{"%DLQ%a%b", "reserved"},
		{"%dlq%billing", "reserved"},
		{"%RETRY%", "reserved"},
		{"%RETRY%a%b", "reserved"},
		{"%DELAY%orders", "reserved"},
		{"bad name", "not allowed"},
	} {
		err := ValidateNewTopic(c.name)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ValidateNewTopic(%q) = %v; want an error saying %q", c.name, err, c.want)
		}
	}
	for _, ok := range []string{"orders", "a..b", ".hidden", "%DLQ%billing", "%DLQ%billing.eu-1", "%RETRY%billing"} {
		if err := ValidateNewTopic(ok); err != nil {
			t.Errorf("ValidateNewTopic(%q) = %v", ok, err)
		}
	}
}

// TestValidateServerName: a broker's id and group are printable, without
// spaces.
func TestValidateServerName(t *testing.T) {
	for _, bad := range []string{"bad id", "tab\tid", "", "nl\n", strings.Repeat("b", 256)} {
		if err := ValidateServerName("broker id", bad); err == nil || !strings.Contains(err.Error(), "broker id") {
			t.Errorf("ValidateServerName(%q) = %v; want an error naming the broker id", bad, err)
		}
	}
	for _, ok := range []string{"g1-master", "host:7401", "b_1.eu"} {
		if err := ValidateServerName("broker id", ok); err != nil {
			t.Errorf("ValidateServerName(%q) = %v", ok, err)
		}
	}
}
