package protocol

import (
	"strings"
	"testing"
)

// TestValidateNameSaysWhatIsWrong pins what a refused name's error tells
// the operator: the character as typed (never a byte of it read as
// Latin-1), its 1-based character position, what a name may contain;
// invalid UTF-8, an empty name and a long one each say so.
func TestValidateNameSaysWhatIsWrong(t *testing.T) {
	const allowed = "a topic name may contain letters a-z A-Z, digits 0-9, '.', '_', '-' and '%'"
	cases := []struct {
		name string
		want []string // substrings of the error, in order
		not  []string // must not appear
	}{
		{"主题-ü", []string{`topic name "主题-ü": character '主' (U+4E3B) at position 1 is not allowed; ` + allowed}, []string{"ä", "byte"}},
		{"orders-ü", []string{`character 'ü' (U+00FC) at position 8 is not allowed`}, []string{"Ã", "byte"}},
		// A Cyrillic 'а' looks like a Latin 'a': its code point tells them apart.
		{"dаta", []string{`character 'а' (U+0430) at position 2`}, nil},
		{"a b", []string{`topic name "a b": character ' ' at position 2 is not allowed`}, []string{"U+"}},
		{"tab\there", []string{`character '\t' at position 4`}, nil},
		{"ok\xffno", []string{`topic name "ok\xffno" is not valid UTF-8 (at character 3, byte 0xff)`}, nil},
		{"", []string{"topic name is empty; a topic name must be 1 to 255 bytes of letters a-z A-Z, digits 0-9, '.', '_', '-' and '%'"}, nil},
		{strings.Repeat("a", 256), []string{`topic name "` + strings.Repeat("a", 40) + `..." is 256 bytes long; a topic name must be 1 to 255 bytes`}, nil},
	}
	for _, c := range cases {
		err := ValidateTopic(c.name)
		if err == nil {
			t.Errorf("%q: accepted", c.name)
			continue
		}
		msg := err.Error()
		rest := msg
		for _, w := range c.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("%q: error %q lacks %q", c.name, msg, w)
				break
			}
			rest = rest[i+len(w):]
		}
		for _, n := range c.not {
			if strings.Contains(msg, n) {
				t.Errorf("%q: error %q contains %q", c.name, msg, n)
			}
		}
	}
	for _, ok := range []string{"a", "orders", "Orders.v2_eu-1", "%DLQ%billing", strings.Repeat("z", MaxTopicLen)} {
		if err := ValidateTopic(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
}

// TestValidateNameExtra: the characters besides letters and digits are the
// caller's, and the error lists those.
func TestValidateNameExtra(t *testing.T) {
	if err := ValidateName("producer", "billing-1.eu_x", 255, "._-"); err != nil {
		t.Fatal(err)
	}
	err := ValidateName("producer", "bill%ing", 255, "._-")
	want := `producer name "bill%ing": character '%' at position 5 is not allowed; a producer name may contain letters a-z A-Z, digits 0-9, '.', '_' and '-'`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}
