package auth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferrymq/ferrymq/protocol"
)

// Kind is what a permission allows.
type Kind uint8

// The permission kinds.
const (
	KindAdmin    Kind = iota + 1 // admin: everything
	KindCluster                  // cluster: what servers do to each other
	KindDescribe                 // describe: read-only admin
	KindProduce                  // produce:<topic-pattern>
	KindConsume                  // consume:<topic-pattern>:<group-pattern>
)

var kindNames = [...]string{KindAdmin: "admin", KindCluster: "cluster", KindDescribe: "describe",
	KindProduce: "produce", KindConsume: "consume"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("KIND(%d)", uint8(k))
}

// Limits on names and permissions.
const (
	// MaxNameLen is the longest principal name, and the longest pattern
	// (the names it matches are at most 255 characters long too).
	MaxNameLen = 255
	// MaxPermissions is the most permissions one principal may hold.
	MaxPermissions = 256
)

// Name characters besides ASCII letters and digits: principal and consumer
// group names take nameChars, topics topicChars ('%' is for system topics
// such as %DLQ%GROUP).
const (
	nameChars  = "._-"
	topicChars = protocol.TopicNameChars
)

// Built-in principal names. They are reserved: the registry refuses a
// principal of either name, so a log line naming one is about the built-in.
const (
	AdminName   = "admin"
	ClusterName = "cluster"
)

// ValidateName checks a principal name: 1 to MaxNameLen characters, each an
// ASCII letter, a digit, '.', '_' or '-' (the characters of producer
// names), and not one of the built-in names.
func ValidateName(name string) error {
	if err := validateChars("principal", name, nameChars); err != nil {
		return err
	}
	if name == AdminName || name == ClusterName {
		return fmt.Errorf("principal name %q is reserved for the built-in principal", name)
	}
	return nil
}

// validateChars checks that s is 1 to MaxNameLen characters of letters,
// digits and extra; what names s in the error (protocol.ValidateName).
func validateChars(what, s, extra string) error {
	return protocol.ValidateName(what, s, MaxNameLen, extra)
}

// Pattern matches names: an exact name, a prefix ending in '*', or "*"
// (every name). Only a ParsePermission'd pattern is valid.
type Pattern string

// Match reports whether the pattern matches name.
func (p Pattern) Match(name string) bool {
	if prefix, ok := strings.CutSuffix(string(p), "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return string(p) == name
}

// parsePattern checks a pattern of what names ("topic", "group"), whose
// names take extra besides letters and digits.
func parsePattern(what, s, extra string) (Pattern, error) {
	if s == "*" {
		return Pattern(s), nil
	}
	body := strings.TrimSuffix(s, "*")
	if i := strings.IndexByte(body, '*'); i >= 0 {
		return "", fmt.Errorf("%s pattern %q: '*' may only end a pattern (an exact name, a prefix ending in '*', or '*')", what, s)
	}
	if err := validateChars(what, body, extra); err != nil {
		return "", fmt.Errorf("%s pattern %q: %w", what, s, err)
	}
	return Pattern(s), nil
}

// Permission is one parsed permission. Topic is set for produce and
// consume, Group for consume.
type Permission struct {
	Kind  Kind
	Topic Pattern
	Group Pattern
}

// The permissions that take no argument.
var (
	Admin    = Permission{Kind: KindAdmin}
	Cluster  = Permission{Kind: KindCluster}
	Describe = Permission{Kind: KindDescribe}
)

// Produce returns produce:<topic>; ParsePermission checks the pattern.
func Produce(topic Pattern) Permission { return Permission{Kind: KindProduce, Topic: topic} }

// Consume returns consume:<topic>:<group>; ParsePermission checks the
// patterns.
func Consume(topic, group Pattern) Permission {
	return Permission{Kind: KindConsume, Topic: topic, Group: group}
}

// String is the permission's canonical text, which ParsePermission reads
// back.
func (p Permission) String() string {
	switch p.Kind {
	case KindProduce:
		return "produce:" + string(p.Topic)
	case KindConsume:
		return "consume:" + string(p.Topic) + ":" + string(p.Group)
	default:
		return p.Kind.String()
	}
}

const permissionForms = "admin, cluster, describe, produce:<topic-pattern> or consume:<topic-pattern>:<group-pattern>"

// ParsePermission parses one permission: admin, cluster, describe,
// produce:<topic-pattern> or consume:<topic-pattern>:<group-pattern>. A
// pattern is an exact name, a prefix ending in '*', or '*'. Topic names
// cannot hold ':', so the text splits at every ':'.
func ParsePermission(s string) (Permission, error) {
	parts := strings.Split(s, ":")
	kind := parts[0]
	fail := func(format string, args ...any) (Permission, error) {
		return Permission{}, fmt.Errorf("permission %q: %s", s, fmt.Sprintf(format, args...))
	}
	switch kind {
	case "admin", "cluster", "describe":
		if len(parts) != 1 {
			return fail("%s takes no pattern", kind)
		}
		switch kind {
		case "admin":
			return Admin, nil
		case "cluster":
			return Cluster, nil
		}
		return Describe, nil
	case "produce":
		if len(parts) != 2 {
			return fail("want produce:<topic-pattern>, e.g. produce:orders or produce:orders.*")
		}
		t, err := parsePattern("topic", parts[1], topicChars)
		if err != nil {
			return fail("%v", err)
		}
		return Produce(t), nil
	case "consume":
		if len(parts) != 3 {
			return fail("want consume:<topic-pattern>:<group-pattern>, e.g. consume:orders:billing or consume:orders.*:*")
		}
		t, err := parsePattern("topic", parts[1], topicChars)
		if err != nil {
			return fail("%v", err)
		}
		g, err := parsePattern("group", parts[2], nameChars)
		if err != nil {
			return fail("%v", err)
		}
		return Consume(t, g), nil
	}
	return fail("unknown kind %q; a permission is %s", kind, permissionForms)
}

// ParsePermissions parses a list of permissions and returns them in their
// canonical order (sorted by text, without duplicates): the form the
// registry stores. At most MaxPermissions; the first error is returned.
func ParsePermissions(list []string) ([]Permission, error) {
	out := make([]Permission, 0, len(list))
	for _, s := range list {
		p, err := ParsePermission(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Permission) int { return strings.Compare(a.String(), b.String()) })
	out = slices.Compact(out)
	if len(out) > MaxPermissions {
		return nil, fmt.Errorf("%d permissions, over the limit of %d", len(out), MaxPermissions)
	}
	return out, nil
}

// ParsePermissionList parses comma-separated permissions (spaces around
// them are ignored), as a command line gives them; "" is none.
func ParsePermissionList(s string) ([]Permission, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return ParsePermissions(parts)
}

// Strings returns the permissions' texts.
func Strings(perms []Permission) []string {
	out := make([]string, len(perms))
	for i, p := range perms {
		out[i] = p.String()
	}
	return out
}
