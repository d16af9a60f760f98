package protocol

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// TopicNameChars are the characters a topic name may hold besides the
// letters a-z, A-Z and the digits: '%' is for system topics such as a
// consumer group's dead letters, %DLQ%GROUP, and its retries, %RETRY%GROUP.
const TopicNameChars = "._-%"

// ValidateTopic checks a topic name: 1 to MaxTopicLen bytes, each a
// letter a-z or A-Z, a digit, or one of TopicNameChars (see ValidateName
// for what its error says).
func ValidateTopic(t string) error {
	return ValidateName("topic", t, MaxTopicLen, TopicNameChars)
}

// DeadLetterPrefix begins a consumer group's dead-letter topic,
// DeadLetterPrefix + GROUP, and RetryPrefix its retry topic, RetryPrefix +
// GROUP (the delayed retries of a group whose consumers do not hold a queue
// for a failed message): with the internal DelayTopicPrefix, the only topic
// names with '%' in them.
const (
	DeadLetterPrefix = "%DLQ%"
	RetryPrefix      = "%RETRY%"
)

// ValidateNewTopic checks the name of a topic to be created: ValidateTopic,
// and besides, no name of dots alone ("." and ".." name directories
// elsewhere) and no '%' but in the system's DeadLetterPrefix or RetryPrefix
// followed by a name without '%'. Topics that exist keep working under ValidateTopic,
// which every request checks.
func ValidateNewTopic(t string) error {
	if err := ValidateTopic(t); err != nil {
		return err
	}
	if strings.Trim(t, ".") == "" {
		return fmt.Errorf("topic name %q is only dots; a topic name needs a letter, a digit, '_' or '-'", t)
	}
	for _, prefix := range []string{DeadLetterPrefix, RetryPrefix} {
		if rest, ok := strings.CutPrefix(t, prefix); ok && rest != "" && !strings.Contains(rest, "%") {
			return nil
		}
	}
	if strings.Contains(t, "%") {
		return fmt.Errorf("topic name %q: '%%' is reserved for the system's topics: a consumer group's dead letters, %sGROUP, and its retries, %sGROUP",
			clipName(t), DeadLetterPrefix, RetryPrefix)
	}
	return nil
}

// TagChars are the characters a tag may hold besides the letters a-z,
// A-Z and the digits (a filter expression separates tags with spaces,
// "||", "&&", "!" and parentheses).
const TagChars = "._-:/"

// ValidateTag checks a message's tag: 1 to MaxTagLen bytes, each a letter
// a-z or A-Z, a digit, or one of TagChars.
func ValidateTag(t string) error {
	return ValidateName("tag", t, MaxTagLen, TagChars)
}

// ValidateServerName checks a broker's id or its group's name (what names
// the kind in the error, "broker id"): 1 to 255 bytes of printable
// characters and no spaces.
func ValidateServerName(what, name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("%s must be 1 to 255 bytes, got %d", what, len(name))
	}
	for i, r := range name {
		if r == utf8.RuneError || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%s %q: character %q at byte %d is not allowed: spaces and unprintable characters are not", what, clipName(name), r, i)
		}
	}
	return nil
}

// ValidateName checks a name in the cluster's namespaces (a topic, a
// producer, a consumer group or member): 1 to maxLen bytes, each an ASCII
// letter (a-z, A-Z), a digit (0-9) or one of the ASCII characters in
// extra. what names the kind of name in the error ("topic", "producer").
//
// The name is read as UTF-8, one character (rune) at a time, so its error
// names the first character that is not allowed as the user typed it, with
// its 1-based character position and, for a character outside ASCII, its
// code point (a look-alike such as a Cyrillic 'а' shows as U+0430), and
// says what the name may contain; bytes that are not UTF-8 are reported as
// such. Every name allowed is ASCII, so its length in bytes is its length
// in characters.
func ValidateName(what, name string, maxLen int, extra string) error {
	if name == "" {
		return fmt.Errorf("%s name is empty; a %s name must be 1 to %d bytes of %s", what, what, maxLen, allowedChars(extra))
	}
	pos := 0
	for i, r := range name {
		pos++
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(name[i:]); size <= 1 {
				return fmt.Errorf("%s name %q is not valid UTF-8 (at character %d, byte %#02x)", what, clipName(name), pos, name[i])
			}
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			r < utf8.RuneSelf && strings.ContainsRune(extra, r) {
			continue
		}
		char := fmt.Sprintf("%q", r)
		switch {
		case r == utf8.RuneError:
			// A JSON request carries bytes that are not UTF-8 as this.
			char += " (U+FFFD, the replacement character: the name held bytes that are not UTF-8)"
		case r >= utf8.RuneSelf:
			char += fmt.Sprintf(" (%U)", r)
		}
		return fmt.Errorf("%s name %q: character %s at position %d is not allowed; a %s name may contain %s",
			what, clipName(name), char, pos, what, allowedChars(extra))
	}
	if len(name) > maxLen {
		return fmt.Errorf("%s name %q is %d bytes long; a %s name must be 1 to %d bytes", what, clipName(name), len(name), what, maxLen)
	}
	return nil
}

// allowedChars says what a name with the extra characters may contain,
// e.g. "letters a-z A-Z, digits 0-9, '.', '_', '-' and '%'".
func allowedChars(extra string) string {
	parts := []string{"letters a-z A-Z", "digits 0-9"}
	for _, c := range extra {
		parts = append(parts, fmt.Sprintf("%q", c))
	}
	last := len(parts) - 1
	return strings.Join(parts[:last], ", ") + " and " + parts[last]
}

// clipName shortens a long name for an error message: its first 40
// characters and "...".
func clipName(name string) string {
	n := 0
	for i := range name {
		if n == 40 {
			return name[:i] + "..."
		}
		n++
	}
	return name
}

// ClipLen is how many bytes of a long value Clip keeps.
const ClipLen = 64

// Clip shortens a value for an error message or a log line, so that a long
// one (a 5,000-byte key) is not echoed whole: its first ClipLen bytes (cut
// at a character boundary) and "...(N bytes)". A value of up to ClipLen
// bytes is returned as it is.
func Clip(s string) string {
	if len(s) <= ClipLen {
		return s
	}
	cut := ClipLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:cut], len(s))
}
