package protocol

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// expr is a filter expression the test builds, printed for ParseFilter and
// judged by its own evaluator (SQL's three truth values as *bool).
type expr struct {
	kind  string // tag all and or not cmp in notin null notnull
	tag   string
	a, b  *expr
	name  string
	op    string
	lits  []string // as written
	nums  []float64
	isNum bool
}

var (
	testTags  = []string{"A", "b-1", "paid", "x.y:z/w", "7"}
	testProps = []string{"region", "amount", "n_1"}
	testTexts = []string{"eu", "us", "it's", "", "10"}
	testNums  = []float64{-5, 0, 10, 100.5}
)

func genExpr(t *rapid.T, depth int) *expr {
	kinds := []string{"tag", "tag", "tag", "tag", "all", "cmp", "in", "notin", "null", "notnull"} // tags most: the fingerprints' case
	if depth < 4 {
		kinds = append(kinds, "and", "or", "not", "and", "or", "not")
	}
	e := &expr{kind: rapid.SampledFrom(kinds).Draw(t, "kind")}
	switch e.kind {
	case "tag":
		e.tag = rapid.SampledFrom(testTags).Draw(t, "tag")
	case "and", "or":
		e.a, e.b = genExpr(t, depth+1), genExpr(t, depth+1)
	case "not":
		e.a = genExpr(t, depth+1)
	case "cmp", "in", "notin", "null", "notnull":
		e.name = rapid.SampledFrom(testProps).Draw(t, "prop")
		e.op = rapid.SampledFrom([]string{"=", "!=", "<>", "<", "<=", ">", ">="}).Draw(t, "op")
		e.isNum = rapid.Bool().Draw(t, "num")
		n := 1
		if e.kind == "in" || e.kind == "notin" {
			n = rapid.IntRange(1, 3).Draw(t, "lits")
		}
		for range n {
			if e.isNum {
				v := rapid.SampledFrom(testNums).Draw(t, "numlit")
				e.nums = append(e.nums, v)
				e.lits = append(e.lits, strconv.FormatFloat(v, 'g', -1, 64))
			} else {
				v := rapid.SampledFrom(testTexts).Draw(t, "textlit")
				e.lits = append(e.lits, "'"+strings.ReplaceAll(v, "'", "''")+"'")
				e.nums = append(e.nums, 0)
			}
		}
	}
	return e
}

// String prints e with every operator spelled one of its ways and full
// parentheses, so the printed text has e's structure.
func (e *expr) print(t *rapid.T) string {
	pick := func(a, b string) string { return rapid.SampledFrom([]string{a, b}).Draw(t, "spelling") }
	switch e.kind {
	case "tag":
		return e.tag
	case "all":
		return "*"
	case "and":
		return "(" + e.a.print(t) + " " + pick("&&", "and") + " " + e.b.print(t) + ")"
	case "or":
		return "(" + e.a.print(t) + " " + pick("||", "OR") + " " + e.b.print(t) + ")"
	case "not":
		return pick("!", "NOT ") + e.a.print(t)
	case "cmp":
		return e.name + " " + e.op + " " + e.lits[0]
	case "in":
		return e.name + " IN (" + strings.Join(e.lits, ", ") + ")"
	case "notin":
		return e.name + " not in (" + strings.Join(e.lits, ",") + ")"
	case "null":
		return e.name + " IS NULL"
	default:
		return e.name + " is not null"
	}
}

func lit(text string, num float64, isNum bool) func(v string) *int {
	return func(v string) *int {
		if isNum {
			x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return nil
			}
			c := 0
			if x < num {
				c = -1
			} else if x > num {
				c = 1
			}
			return &c
		}
		c := strings.Compare(v, text)
		return &c
	}
}

// judge is the model: nil is unknown.
func (e *expr) judge(tag string, props map[string]string) *bool {
	b := func(v bool) *bool { return &v }
	switch e.kind {
	case "tag":
		return b(tag == e.tag)
	case "all":
		return b(true)
	case "not":
		if a := e.a.judge(tag, props); a != nil {
			return b(!*a)
		}
		return nil
	case "and", "or":
		a, c := e.a.judge(tag, props), e.b.judge(tag, props)
		short := e.kind == "or" // the value that decides
		if a != nil && *a == short || c != nil && *c == short {
			return b(short)
		}
		if a == nil || c == nil {
			return nil
		}
		return b(!short)
	case "null", "notnull":
		_, ok := props[e.name]
		return b(ok == (e.kind == "notnull"))
	}
	v, ok := props[e.name]
	if !ok {
		return nil
	}
	cmpWith := func(i int) *int {
		text := ""
		if !e.isNum {
			text, _ = strconv.Unquote(`"` + strings.ReplaceAll(strings.Trim(e.lits[i], "'"), "''", "'") + `"`)
		}
		return lit(text, e.nums[i], e.isNum)(v)
	}
	if e.kind == "cmp" {
		c := cmpWith(0)
		if c == nil {
			return nil
		}
		switch e.op {
		case "=":
			return b(*c == 0)
		case "!=", "<>":
			return b(*c != 0)
		case "<":
			return b(*c < 0)
		case "<=":
			return b(*c <= 0)
		case ">":
			return b(*c > 0)
		}
		return b(*c >= 0)
	}
	var r *bool = b(false)
	for i := range e.lits {
		c := cmpWith(i)
		if c == nil {
			r = nil
			continue
		}
		if *c == 0 {
			r = b(true)
			break
		}
	}
	if r != nil && e.kind == "notin" {
		return b(!*r)
	}
	return r
}

// TestFilterMatchesTheModel: any expression of the grammar, printed in any
// of its spellings, parses, and matches exactly the messages the model
// says are true (tags, properties present or not, numbers and text).
func TestFilterMatchesTheModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		e := genExpr(t, 0)
		src := e.print(t)
		f, err := ParseFilter(src)
		if err != nil {
			t.Fatalf("ParseFilter(%q): %v", src, err)
		}
		if f.String() != src {
			t.Fatalf("String() = %q, want %q", f.String(), src)
		}
		// Another spelling has the same canonical form, which parses to
		// itself and matches as the model says (below).
		other, err := ParseFilter(e.print(t))
		if err != nil || other.Canonical() != f.Canonical() {
			t.Fatalf("%q and another spelling %q: canonical %q and %q (%v)", src, other, f.Canonical(), other.Canonical(), err)
		}
		canon, err := ParseFilter(f.Canonical())
		if err != nil || canon.Canonical() != f.Canonical() {
			t.Fatalf("canonical %q of %q does not parse to itself: %v", f.Canonical(), src, err)
		}
		for range 16 {
			tag := rapid.SampledFrom(append([]string{""}, testTags...)).Draw(t, "msg tag")
			props := map[string]string{}
			for _, p := range testProps {
				if rapid.Bool().Draw(t, "has "+p) {
					props[p] = rapid.SampledFrom([]string{"eu", "us", "it's", "", "10", "100.5", "-5", " 0 ", "x1"}).Draw(t, p)
				}
			}
			want := e.judge(tag, props)
			got := f.Match(tag, func(n string) (string, bool) { v, ok := props[n]; return v, ok })
			if got != (want != nil && *want) {
				t.Fatalf("%s on tag %q props %v: Match %v, model %v", src, tag, props, got, fmtTri(want))
			}
			if c := canon.Match(tag, func(n string) (string, bool) { v, ok := props[n]; return v, ok }); c != got {
				t.Fatalf("canonical %s on tag %q props %v: Match %v, the expression %v", canon.Canonical(), tag, props, c, got)
			}
			m := Message{ID: "id", Topic: "t", Tag: tag, Body: []byte("body"), Producer: ProducerStamp{ID: 1, Seq: 2},
				Schedule: Schedule{Kind: ScheduleDelayed, At: 1}}
			for _, k := range slices.Sorted(maps.Keys(props)) {
				m.Properties = append(m.Properties, Property{Key: k, Value: props[k]})
			}
			if fp := EncodedTagFingerprint(AppendMessage(nil, &m)); fp != TagFingerprint(tag) {
				t.Fatalf("the encoded message of tag %q has fingerprint %#x, its tag %#x", tag, fp, TagFingerprint(tag))
			}
			if e := f.MatchEncoded(AppendMessage(nil, &m)); e != got {
				t.Fatalf("%s on the encoded message of tag %q props %v: %v, Match %v", src, tag, props, e, got)
			}
			if got && !f.Candidate(TagFingerprint(tag)) {
				t.Fatalf("%s matches tag %q props %v, but its fingerprint %#x is no candidate", src, tag, props, TagFingerprint(tag))
			}
		}
	})
}

func fmtTri(b *bool) string {
	if b == nil {
		return "unknown"
	}
	return fmt.Sprint(*b)
}

func TestFilterExamples(t *testing.T) {
	props := func(kv ...string) func(string) (string, bool) {
		return func(n string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == n {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	cases := []struct {
		expr  string
		tag   string
		props func(string) (string, bool)
		want  bool
	}{
		{"A || B", "A", props(), true},
		{"A || B", "C", props(), false},
		{"A || B", "", props(), false},
		{"*", "", props(), true},
		{"!A", "", props(), true},
		{"(A || B) && region = 'eu'", "B", props("region", "eu"), true},
		{"(A || B) && region = 'eu'", "B", props(), false},
		{"NOT region = 'eu'", "", props(), false}, // unknown stays unknown
		{"region IS NULL", "", props(), true},
		{"amount > 100", "", props("amount", "150"), true},
		{"amount > 100", "", props("amount", "99.5"), false},
		{"amount > 100", "", props("amount", "lots"), false},
		{"amount > 100 OR A", "A", props("amount", "lots"), true},
		{"region IN ('eu', 'uk')", "", props("region", "uk"), true},
		{"region NOT IN ('eu', 'uk')", "", props("region", "us"), true},
		{"name = 'it''s'", "", props("name", "it's"), true},
		{"7 || 8", "7", props(), true},
		// AND binds tighter than OR, NOT tighter than AND.
		{"A || B && region = 'eu'", "A", props(), true},
		{"A || B AND region = 'eu'", "B", props(), false},
		{"!A && B", "B", props(), true},
		{"NOT A AND A", "A", props(), false},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.expr)
		if err != nil {
			t.Fatalf("ParseFilter(%q): %v", c.expr, err)
		}
		if got := f.Match(c.tag, c.props); got != c.want {
			t.Errorf("%q on tag %q: %v, want %v", c.expr, c.tag, got, c.want)
		}
	}
}

func TestFilterCanonical(t *testing.T) {
	for src, want := range map[string]string{
		"A||B":                              "A OR B",
		"B || A || B":                       "A OR B",
		"c && (b || a) && a":                "a AND (a OR b) AND c",
		"a || b && !c":                      "NOT c AND b OR a",
		"(a || b) and not (c or d)":         "NOT (c OR d) AND (a OR b)",
		"x in ( 'a','b' ) or y is not null": "x IN ('a', 'b') OR y IS NOT NULL",
		"amount>=100.50 && n <> 'it''s'":    "amount >= 100.5 AND n <> 'it''s'",
		"a != 1":                            "a <> 1",
		"a IN (2, 1, 2)":                    "a IN (1, 2)",
		"a IN (1, 1)":                       "a = 1",
		"a NOT IN ('x')":                    "a <> 'x'",
		"n > 1e300 OR n < 5e-324":           "n < 5e-324 OR n > 1e300",
		"n <> 'it''s' && amount>=100.50":    "amount >= 100.5 AND n <> 'it''s'",
		"*":                                 "*",
	} {
		f, err := ParseFilter(src)
		if err != nil {
			t.Fatalf("ParseFilter(%q): %v", src, err)
		}
		if got := f.Canonical(); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", src, got, want)
		}
	}
}

func TestFilterRefuses(t *testing.T) {
	for _, bad := range []string{
		"", "   ", "A ||", "|| A", "A B", "(A", "A)", "region =", "region = eu", "= 'x'", "'text'",
		"region IN ()", "region IN ('a'", "region IS", "region IS NOT", "a NOT b", "AND", "NOT",
		"1x = 3", "a:b = 1", "+x = 1", "A # B", "region = 'open", strings.Repeat("(", 200) + "A" + strings.Repeat(")", 200),
		strings.Repeat("!", 100) + "A", strings.Repeat("A || ", 1000) + "A",
	} {
		if f, err := ParseFilter(bad); err == nil {
			t.Errorf("ParseFilter(%.40q) = %v, want an error", bad, f)
		}
	}
}

// FuzzParseFilter: no input panics or hangs the parser; what parses
// matches without panicking.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"A || B", "(a && !b) OR region = 'eu'", "amount >= -5.5", "x IN ('a','b')", "y IS NOT NULL", "*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		flt, err := ParseFilter(s)
		if err != nil {
			return
		}
		flt.Match("A", func(string) (string, bool) { return "1", true })
	})
}

// TestFilterSkipsByFingerprint: a filter over tags skips, by fingerprint
// alone, all but a few of the messages with other tags (about 1 in 496
// shares a fingerprint); one that any tag can match skips nothing.
func TestFilterSkipsByFingerprint(t *testing.T) {
	f, err := ParseFilter("(A || B) && amount > 5")
	if err != nil {
		t.Fatal(err)
	}
	if !f.SkipsByTag() || !f.Candidate(TagFingerprint("A")) || !f.Candidate(TagFingerprint("B")) || f.Candidate(TagFingerprint("")) {
		t.Fatalf("A || B: skips by tag %v, A %v, B %v, untagged %v", f.SkipsByTag(),
			f.Candidate(TagFingerprint("A")), f.Candidate(TagFingerprint("B")), f.Candidate(0))
	}
	passed := 0
	for i := range 10000 {
		if f.Candidate(TagFingerprint(fmt.Sprintf("tag-%d", i))) {
			passed++
		}
	}
	if passed > 100 { // 2 in 496 expected: about 40
		t.Fatalf("%d of 10000 other tags are candidates", passed)
	}
	for _, all := range []string{"*", "!A", "region = 'eu'", "A || region = 'eu'"} {
		if f, _ := ParseFilter(all); f.SkipsByTag() || !f.Candidate(0) || !f.Candidate(TagFingerprint("zz")) {
			t.Fatalf("%q skips by tag", all)
		}
	}
	if f, _ := ParseFilter("A && B"); !f.SkipsByTag() || f.Candidate(TagFingerprint("A")) && TagFingerprint("A") != TagFingerprint("B") {
		t.Fatal("A && B (no message has both tags) takes tag A")
	}
	for i := range 1000 {
		if fp := TagFingerprint(fmt.Sprint(i)); bitsSet(fp) != 2 {
			t.Fatalf("fingerprint %#x of %d has %d bits", fp, i, bitsSet(fp))
		}
	}
}

func bitsSet(x uint32) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// BenchmarkMatchEncoded: what judging one stored message costs a broker,
// for a filter of tags and for one that reads a property.
func BenchmarkMatchEncoded(b *testing.B) {
	m := Message{ID: "0123456789abcdef", Topic: "orders", Tag: "TagB", Body: make([]byte, 1024),
		Properties: []Property{{Key: "region", Value: "eu"}, {Key: "amount", Value: "150"}}}
	raw := AppendMessage(nil, &m)
	for _, expr := range []string{"TagA || TagB", "(TagA || TagB) AND region = 'eu' AND amount > 100"} {
		f, err := ParseFilter(expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strings.Fields(expr)[0], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !f.MatchEncoded(raw) {
					b.Fatal("no match")
				}
			}
		})
	}
}
