package auth

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParsePermission(t *testing.T) {
	good := map[string]Permission{
		"admin":                      Admin,
		"cluster":                    Cluster,
		"describe":                   Describe,
		"produce:orders":             Produce("orders"),
		"produce:orders.*":           Produce("orders.*"),
		"produce:*":                  Produce("*"),
		"produce:%DLQ%billing":       Produce("%DLQ%billing"),
		"consume:orders:billing":     Consume("orders", "billing"),
		"consume:orders.*:*":         Consume("orders.*", "*"),
		"consume:*:bill-ing_2.*":     Consume("*", "bill-ing_2.*"),
		"produce:" + long(255):       Produce(Pattern(long(255))),
		"produce:" + long(255) + "*": Produce(Pattern(long(255) + "*")),
	}
	for s, want := range good {
		got, err := ParsePermission(s)
		if err != nil || got != want {
			t.Errorf("ParsePermission(%q) = %v, %v; want %v", s, got, err, want)
			continue
		}
		if got.String() != s {
			t.Errorf("%q reads back as %q", s, got.String())
		}
	}
	bad := map[string]string{
		"":                         `unknown kind ""; a permission is admin, cluster, describe, produce:<topic-pattern> or consume:<topic-pattern>:<group-pattern>`,
		"write:orders":             `unknown kind "write"`,
		"Admin":                    `unknown kind "Admin"`,
		"admin:x":                  "admin takes no pattern",
		"describe:":                "describe takes no pattern",
		"produce":                  "want produce:<topic-pattern>",
		"produce:":                 "topic name is empty",
		"produce:a:b":              "want produce:<topic-pattern>",
		"produce:or*ders":          "'*' may only end a pattern",
		"produce:**":               "'*' may only end a pattern",
		"produce:ord ers":          `character ' ' at position 4 is not allowed`,
		"produce:" + long(256):     "is 256 bytes long; a topic name must be 1 to 255 bytes",
		"consume:orders":           "want consume:<topic-pattern>:<group-pattern>",
		"consume:orders:":          "group name is empty",
		"consume:orders:%DLQ%x":    `group pattern "%DLQ%x"`,
		"consume:orders:billing:x": "want consume:",
		" admin":                   `unknown kind " admin"`,
	}
	for s, want := range bad {
		_, err := ParsePermission(s)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "permission "+quote(s)+": ") {
			t.Errorf("ParsePermission(%q) = %v; want an error naming it and saying %q", s, err, want)
		}
	}
}

func long(n int) string { return strings.Repeat("a", n) }

func quote(s string) string { return `"` + s + `"` }

func TestPatternMatch(t *testing.T) {
	cases := []struct {
		pattern Pattern
		name    string
		want    bool
	}{
		{"orders", "orders", true},
		{"orders", "orders.eu", false},
		{"orders", "order", false},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders.", true},
		{"orders.*", "orders", false},
		{"orders*", "orders", true},
		{"orders*", "ordersx", true},
		{"*", "anything", true},
		{"*", "", true},
		{"Orders", "orders", false},
	}
	for _, c := range cases {
		if got := c.pattern.Match(c.name); got != c.want {
			t.Errorf("%q.Match(%q) = %v", c.pattern, c.name, got)
		}
	}
}

func TestParsePermissionsIsCanonical(t *testing.T) {
	got, err := ParsePermissionList(" produce:b ,admin,produce:a, produce:b")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"admin", "produce:a", "produce:b"}; !slices.Equal(Strings(got), want) {
		t.Fatalf("got %v, want %v", Strings(got), want)
	}
	if got, err := ParsePermissionList("  "); err != nil || len(got) != 0 {
		t.Fatalf("empty list: %v %v", got, err)
	}
	if _, err := ParsePermissionList("admin,,describe"); err == nil {
		t.Fatal("an empty item parsed")
	}
	many := make([]string, MaxPermissions+1)
	for i := range many {
		many[i] = "produce:t" + strconv.Itoa(i)
	}
	if _, err := ParsePermissions(many); err == nil || !strings.Contains(err.Error(), "over the limit of 256") {
		t.Fatalf("%d permissions: %v", len(many), err)
	}
	if _, err := ParsePermissions(many[1:]); err != nil {
		t.Fatalf("%d permissions: %v", MaxPermissions, err)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"app1", "a", "billing.eu_2-x", long(255)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	bad := map[string]string{
		"":        "principal name is empty",
		long(256): "is 256 bytes long",
		"a b":     `character ' ' at position 2 is not allowed`,
		"%x":      `character '%' at position 1`,
		"a:b":     `character ':'`,
		"admin":   "reserved for the built-in principal",
		"cluster": "reserved for the built-in principal",
	}
	for name, want := range bad {
		if err := ValidateName(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateName(%q) = %v; want %q", name, err, want)
		}
	}
}

// FuzzParsePermission: whatever parses reads back as itself (one text per
// permission) and never panics.
func FuzzParsePermission(f *testing.F) {
	for _, s := range []string{"admin", "produce:orders.*", "consume:*:g", "consume:a:b:c", "produce:%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePermission(s)
		if err != nil {
			return
		}
		if p.String() != s {
			t.Fatalf("%q parsed as %v", s, p)
		}
	})
}
