package protocol

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Filter is a consumer group's subscription expression over a message's
// tag and properties, parsed by ParseFilter. Grammar (keywords in any
// case, && || ! the same as AND OR NOT):
//
//	expr       = or
//	or         = and { ("||" | "OR") and }
//	and        = unary { ("&&" | "AND") unary }
//	unary      = ("!" | "NOT") unary | primary
//	primary    = "(" expr ")" | "*" | TAG | comparison
//	comparison = NAME op literal | NAME ["NOT"] "IN" "(" literal { "," literal } ")"
//	           | NAME "IS" ["NOT"] "NULL"
//	op         = "=" | "!=" | "<>" | "<" | "<=" | ">" | ">="
//	literal    = 'text' (a quote inside doubled: 'it''s') | number
//
// A bare word is a tag (ValidateTag's characters): it holds when the
// message's tag is that word; "*" holds for every message. A word
// followed by an operator, IN or IS is a property name (letters, digits,
// "_", "." and "-", not starting with a digit). A comparison with a
// number compares numerically and is unknown when the property is not a
// number; with text it compares the text. A missing property makes a
// comparison unknown, and unknown follows SQL: NOT unknown is unknown,
// false AND unknown is false, true OR unknown is true; a message matches
// only when the whole expression is true. So `region = 'eu'` does not
// match a message without the property "region", and neither does
// `NOT region = 'eu'`; `region IS NULL` does.
type Filter struct {
	src  string
	root *fnode
	once sync.Once
	cand candidates
}

// MaxFilterLen bounds a filter expression's text.
const MaxFilterLen = 4096

// fnode is one node of a parsed filter.
type fnode struct {
	op    fop
	a, b  *fnode // and, or: both; not: a
	tag   string // tag
	name  string // comparisons, in, null
	cmp   string // comparison operator
	lits  []flit // the literal(s) compared with
	isNot bool   // NOT IN, IS NOT NULL
}

type fop uint8

const (
	fAll fop = iota
	fTag
	fAnd
	fOr
	fNot
	fCmp
	fIn
	fNull
)

// flit is a literal: text, or a number.
type flit struct {
	text  string
	num   float64
	isNum bool
}

// tri is a truth value of SQL's three.
type tri int8

const (
	unknown tri = iota
	no
	yes
)

// ParseFilter parses a filter expression (see Filter). An empty or blank
// one is refused: the filter that takes everything is "*".
func ParseFilter(s string) (*Filter, error) {
	if len(s) > MaxFilterLen {
		return nil, fmt.Errorf("filter of %d bytes over the cap %d", len(s), MaxFilterLen)
	}
	p := &fparser{src: s}
	if err := p.lex(); err != nil {
		return nil, err
	}
	if len(p.toks) == 0 {
		return nil, fmt.Errorf(`empty filter (the filter of every message is "*")`)
	}
	root, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.toks) {
		return nil, p.errAt(p.toks[p.i], "unexpected "+p.toks[p.i].text)
	}
	return &Filter{src: s, root: root}, nil
}

// String is the expression as it was parsed.
func (f *Filter) String() string { return f.src }

// Canonical is the expression in one spelling: keywords AND OR NOT IN IS
// NULL in capitals, one space between tokens, parentheses only where
// precedence needs them, numbers in plain decimal, and the operands of a
// run of ANDs or of ORs sorted and without repeats (both are commutative,
// associative and idempotent in SQL's logic too). Two expressions that
// differ only so ("B || A" and "A OR B") have the same canonical form, so a
// registry can tell whether two members ask for the same filter;
// ParseFilter of it gives a filter that matches the same messages.
func (f *Filter) Canonical() string { return canonOf(f.root).text }

// canonForm is a node's canonical text, its operator and, for a run of
// ANDs or ORs, its operands' forms (sorted, without repeats).
type canonForm struct {
	op    fop
	text  string
	terms []canonForm
}

func canonOf(n *fnode) canonForm {
	switch n.op {
	case fAnd, fOr:
		var ts []canonForm
		n.operands(n.op, func(c *fnode) {
			if f := canonOf(c); f.op == n.op {
				ts = append(ts, f.terms...) // (a OR a) OR b: one run
			} else {
				ts = append(ts, f)
			}
		})
		slices.SortFunc(ts, func(x, y canonForm) int { return strings.Compare(x.text, y.text) })
		ts = slices.CompactFunc(ts, func(x, y canonForm) bool { return x.text == y.text })
		if len(ts) == 1 {
			return ts[0] // a AND a is a
		}
		parts := make([]string, len(ts))
		for i, t := range ts {
			parts[i] = t.text
			if n.op == fAnd && t.op == fOr {
				parts[i] = "(" + t.text + ")"
			}
		}
		sep := " AND "
		if n.op == fOr {
			sep = " OR "
		}
		return canonForm{op: n.op, text: strings.Join(parts, sep), terms: ts}
	case fNot:
		f := canonOf(n.a)
		if f.op == fAnd || f.op == fOr {
			return canonForm{op: fNot, text: "NOT (" + f.text + ")"}
		}
		return canonForm{op: fNot, text: "NOT " + f.text}
	}
	var b strings.Builder
	n.printLeaf(&b)
	return canonForm{op: n.op, text: b.String()}
}

// operands calls fn with each operand of the run of op (AND or OR) that n
// heads, in order.
func (n *fnode) operands(op fop, fn func(*fnode)) {
	if n.op != op {
		fn(n)
		return
	}
	n.a.operands(op, fn)
	n.b.operands(op, fn)
}

// printLeaf writes a node that is neither AND, OR nor NOT.
func (n *fnode) printLeaf(b *strings.Builder) {
	switch n.op {
	case fAll:
		b.WriteByte('*')
	case fTag:
		b.WriteString(n.tag)
	case fNull:
		b.WriteString(n.name + " IS ")
		if n.isNot {
			b.WriteString("NOT ")
		}
		b.WriteString("NULL")
	case fCmp:
		op := n.cmp
		if op == "!=" {
			op = "<>"
		}
		b.WriteString(n.name + " " + op + " ")
		n.lits[0].print(b)
	case fIn:
		// A list is a set: sorted, without repeats; a set of one is a
		// comparison (x IN (1) is x = 1, x NOT IN (1) is x <> 1).
		lits := make([]string, len(n.lits))
		for i, l := range n.lits {
			var t strings.Builder
			l.print(&t)
			lits[i] = t.String()
		}
		slices.Sort(lits)
		lits = slices.Compact(lits)
		switch {
		case len(lits) == 1 && n.isNot:
			b.WriteString(n.name + " <> " + lits[0])
		case len(lits) == 1:
			b.WriteString(n.name + " = " + lits[0])
		case n.isNot:
			b.WriteString(n.name + " NOT IN (" + strings.Join(lits, ", ") + ")")
		default:
			b.WriteString(n.name + " IN (" + strings.Join(lits, ", ") + ")")
		}
	}
}

func (l flit) print(b *strings.Builder) {
	if l.isNum {
		// The shortest form, its exponent without "+" (which the lexer
		// reads only at a word's start): 1e300, not 301 digits.
		b.WriteString(strings.Replace(strconv.FormatFloat(l.num, 'g', -1, 64), "e+", "e", 1))
		return
	}
	b.WriteString("'" + strings.ReplaceAll(l.text, "'", "''") + "'")
}

// Match says whether a message with tag tag (possibly "") and properties
// prop (ok false: absent) is one the filter takes.
func (f *Filter) Match(tag string, prop func(name string) (string, bool)) bool {
	return f.root.eval(tag, prop) == yes
}

func (n *fnode) eval(tag string, prop func(string) (string, bool)) tri {
	switch n.op {
	case fAll:
		return yes
	case fTag:
		return truth(tag == n.tag)
	case fNot:
		switch n.a.eval(tag, prop) {
		case yes:
			return no
		case no:
			return yes
		}
		return unknown
	case fAnd:
		a := n.a.eval(tag, prop)
		if a == no {
			return no
		}
		b := n.b.eval(tag, prop)
		if b == no {
			return no
		}
		if a == yes && b == yes {
			return yes
		}
		return unknown
	case fOr:
		a := n.a.eval(tag, prop)
		if a == yes {
			return yes
		}
		b := n.b.eval(tag, prop)
		if b == yes {
			return yes
		}
		if a == no && b == no {
			return no
		}
		return unknown
	case fNull:
		_, ok := prop(n.name)
		return truth(ok == n.isNot)
	}
	v, ok := prop(n.name)
	if !ok {
		return unknown
	}
	if n.op == fIn {
		r := no
		for _, l := range n.lits {
			if c, ok := compare(v, l); ok && c == 0 {
				r = yes
				break
			} else if !ok {
				r = unknown
			}
		}
		if n.isNot && r != unknown {
			r = yes + no - r
		}
		return r
	}
	c, ok := compare(v, n.lits[0])
	if !ok {
		return unknown
	}
	switch n.cmp {
	case "=":
		return truth(c == 0)
	case "!=", "<>":
		return truth(c != 0)
	case "<":
		return truth(c < 0)
	case "<=":
		return truth(c <= 0)
	case ">":
		return truth(c > 0)
	default: // ">="
		return truth(c >= 0)
	}
}

func truth(b bool) tri {
	if b {
		return yes
	}
	return no
}

// compare compares a property's value with a literal: numerically for a
// number literal (not ok when the value is not a number), else as text.
func compare(v string, l flit) (int, bool) {
	if !l.isNum {
		return strings.Compare(v, l.text), true
	}
	x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || x != x { // NaN compares with nothing
		return 0, false
	}
	switch {
	case x < l.num:
		return -1, true
	case x > l.num:
		return 1, true
	}
	return 0, true
}

// A token of a filter expression.
type ftok struct {
	kind byte // 'w' word, 's' text literal, 'n' number, 'p' punctuation
	text string
	lit  flit
	at   int // byte offset in the expression
}

type fparser struct {
	src  string
	toks []ftok
	i    int
}

func (p *fparser) errAt(t ftok, msg string) error {
	return fmt.Errorf("filter %q: %s at byte %d", clipName(p.src), msg, t.at)
}

func (p *fparser) lex() error {
	s := p.src
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'':
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(s) {
					return fmt.Errorf("filter %q: text from byte %d has no closing quote", clipName(s), i)
				}
				if s[j] == '\'' {
					if j+1 < len(s) && s[j+1] == '\'' {
						b.WriteByte('\'')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(s[j])
				j++
			}
			p.toks = append(p.toks, ftok{kind: 's', text: s[i : j+1], lit: flit{text: b.String()}, at: i})
			i = j + 1
		case strings.HasPrefix(s[i:], "||") || strings.HasPrefix(s[i:], "&&") || strings.HasPrefix(s[i:], "!=") ||
			strings.HasPrefix(s[i:], "<>") || strings.HasPrefix(s[i:], "<=") || strings.HasPrefix(s[i:], ">="):
			p.toks = append(p.toks, ftok{kind: 'p', text: s[i : i+2], at: i})
			i += 2
		case strings.IndexByte("()!=<>,*", c) >= 0:
			p.toks = append(p.toks, ftok{kind: 'p', text: s[i : i+1], at: i})
			i++
		case isWordByte(c) || c == '+':
			j := i + 1
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			w := s[i:j]
			if n, err := strconv.ParseFloat(w, 64); err == nil && (c == '-' || c == '+' || c == '.' || c >= '0' && c <= '9') && n == n {
				p.toks = append(p.toks, ftok{kind: 'n', text: w, lit: flit{num: n, isNum: true}, at: i})
			} else {
				p.toks = append(p.toks, ftok{kind: 'w', text: w, at: i})
			}
			i = j
		default:
			return fmt.Errorf("filter %q: character %q at byte %d is not allowed", clipName(s), rune(c), i)
		}
	}
	return nil
}

// isWordByte: the bytes of a tag, a property name or a number.
func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(TagChars, c) >= 0
}

// maxFilterDepth bounds nesting, so that a hostile expression cannot
// exhaust the stack.
const maxFilterDepth = 64

func (p *fparser) peek() (ftok, bool) {
	if p.i < len(p.toks) {
		return p.toks[p.i], true
	}
	return ftok{}, false
}

// keyword says whether t is the word kw (any case) or its symbol.
func keyword(t ftok, kw, sym string) bool {
	return t.kind == 'w' && strings.EqualFold(t.text, kw) || sym != "" && t.kind == 'p' && t.text == sym
}

func (p *fparser) or(depth int) (*fnode, error) {
	a, err := p.and(depth)
	if err != nil {
		return nil, err
	}
	for t, ok := p.peek(); ok && keyword(t, "OR", "||"); t, ok = p.peek() {
		p.i++
		b, err := p.and(depth)
		if err != nil {
			return nil, err
		}
		a = &fnode{op: fOr, a: a, b: b}
	}
	return a, nil
}

func (p *fparser) and(depth int) (*fnode, error) {
	a, err := p.unary(depth)
	if err != nil {
		return nil, err
	}
	for t, ok := p.peek(); ok && keyword(t, "AND", "&&"); t, ok = p.peek() {
		p.i++
		b, err := p.unary(depth)
		if err != nil {
			return nil, err
		}
		a = &fnode{op: fAnd, a: a, b: b}
	}
	return a, nil
}

func (p *fparser) unary(depth int) (*fnode, error) {
	if depth > maxFilterDepth {
		return nil, fmt.Errorf("filter %q: nested deeper than %d", clipName(p.src), maxFilterDepth)
	}
	t, ok := p.peek()
	if !ok {
		return nil, fmt.Errorf("filter %q: ends where a tag, a comparison or ( is wanted", clipName(p.src))
	}
	if keyword(t, "NOT", "!") {
		p.i++
		a, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return &fnode{op: fNot, a: a}, nil
	}
	return p.primary(depth)
}

func (p *fparser) primary(depth int) (*fnode, error) {
	t, _ := p.peek()
	p.i++
	switch {
	case t.kind == 'p' && t.text == "(":
		n, err := p.or(depth + 1)
		if err != nil {
			return nil, err
		}
		if c, ok := p.peek(); !ok || c.kind != 'p' || c.text != ")" {
			return nil, fmt.Errorf("filter %q: the ( at byte %d is not closed", clipName(p.src), t.at)
		}
		p.i++
		return n, nil
	case t.kind == 'p' && t.text == "*":
		return &fnode{op: fAll}, nil
	case t.kind == 'n': // a tag that reads as a number (a property name cannot)
		if err := ValidateTag(t.text); err != nil {
			return nil, p.errAt(t, err.Error())
		}
		return &fnode{op: fTag, tag: t.text}, nil
	case t.kind != 'w' || isReserved(t.text):
		return nil, p.errAt(t, fmt.Sprintf("%s where a tag, a comparison or ( is wanted", t.text))
	}
	next, ok := p.peek()
	switch {
	case ok && next.kind == 'p' && strings.Contains(" = != <> < <= > >= ", " "+next.text+" "):
		if err := checkPropName(p, t); err != nil {
			return nil, err
		}
		p.i++
		l, err := p.literal()
		if err != nil {
			return nil, err
		}
		return &fnode{op: fCmp, name: t.text, cmp: next.text, lits: []flit{l}}, nil
	case ok && (keyword(next, "IN", "") || keyword(next, "NOT", "")):
		if err := checkPropName(p, t); err != nil {
			return nil, err
		}
		n := &fnode{op: fIn, name: t.text}
		if keyword(next, "NOT", "") {
			p.i++
			if in, ok := p.peek(); !ok || !keyword(in, "IN", "") {
				return nil, p.errAt(next, "NOT after a property name wants IN")
			}
			n.isNot = true
		}
		p.i++
		if o, ok := p.peek(); !ok || o.kind != 'p' || o.text != "(" {
			return nil, fmt.Errorf("filter %q: IN wants a list in parentheses after %s", clipName(p.src), t.text)
		}
		p.i++
		for {
			l, err := p.literal()
			if err != nil {
				return nil, err
			}
			n.lits = append(n.lits, l)
			c, ok := p.peek()
			if ok && c.kind == 'p' && c.text == "," {
				p.i++
				continue
			}
			if !ok || c.kind != 'p' || c.text != ")" {
				return nil, fmt.Errorf("filter %q: the IN list after %s is not closed", clipName(p.src), t.text)
			}
			p.i++
			return n, nil
		}
	case ok && keyword(next, "IS", ""):
		if err := checkPropName(p, t); err != nil {
			return nil, err
		}
		p.i++
		n := &fnode{op: fNull, name: t.text}
		if c, ok := p.peek(); ok && keyword(c, "NOT", "") {
			p.i++
			n.isNot = true
		}
		if c, ok := p.peek(); !ok || !keyword(c, "NULL", "") {
			return nil, fmt.Errorf("filter %q: IS wants NULL or NOT NULL after %s", clipName(p.src), t.text)
		}
		p.i++
		return n, nil
	}
	if err := ValidateTag(t.text); err != nil {
		return nil, p.errAt(t, err.Error())
	}
	return &fnode{op: fTag, tag: t.text}, nil
}

func isReserved(w string) bool {
	for _, k := range []string{"AND", "OR", "NOT", "IN", "IS", "NULL"} {
		if strings.EqualFold(w, k) {
			return true
		}
	}
	return false
}

func checkPropName(p *fparser, t ftok) error {
	c := t.text[0]
	if c >= '0' && c <= '9' || c == '-' || c == '.' || c == '+' || strings.ContainsAny(t.text, ":/+") {
		return p.errAt(t, fmt.Sprintf("%q is not a property name (letters, digits, _ . -, not starting with a digit)", t.text))
	}
	return nil
}

func (p *fparser) literal() (flit, error) {
	t, ok := p.peek()
	if !ok || t.kind != 's' && t.kind != 'n' {
		if !ok {
			return flit{}, fmt.Errorf("filter %q: ends where 'text' or a number is wanted", clipName(p.src))
		}
		return flit{}, p.errAt(t, fmt.Sprintf("%s where 'text' or a number is wanted", t.text))
	}
	p.i++
	return t.lit, nil
}

// TagFingerprint is what a broker's queue index keeps of a message's tag
// so that a filter can skip messages without reading them: two of 32 bits
// set by the tag's hash (no bit for no tag). Two tags share a fingerprint
// with odds of about 1 in 496. Brokers' index files keep it: changing it
// needs a new index format version, so that they are rebuilt.
func TagFingerprint(tag string) uint32 {
	if tag == "" {
		return 0
	}
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(tag); i++ {
		h ^= uint64(tag[i])
		h *= 1099511628211
	}
	a, b := uint32(h&31), uint32(h>>5&31)
	if b == a {
		b = (a + 1 + uint32(h>>10)%31) & 31
	}
	return 1<<a | 1<<b
}

// candidates is what the filter needs of a tag: the fingerprints of the
// tags a matching message can have, or every tag (anyTag). A message whose
// fingerprint is not among them cannot match, whatever its properties.
type candidates struct {
	anyTag bool
	fps    []uint32
	// pairs holds fps for Candidate: pairs[a] has bit b for a fingerprint
	// of bits a < b, so a look-up is one load whatever the number of tags.
	pairs [32]uint32
}

// Candidate says whether a message whose tag has fingerprint fp may match:
// false only when it cannot (true does not promise a match: Match
// decides, on the whole message).
func (f *Filter) Candidate(fp uint32) bool {
	c := f.cands()
	if c.anyTag {
		return true
	}
	lo := fp & -fp
	hi := fp &^ lo
	return lo != 0 && hi != 0 && hi&(hi-1) == 0 && c.pairs[bits.TrailingZeros32(lo)]&hi != 0
}

// SkipsByTag says whether Candidate ever says false: a filter over tags,
// not one that any tag can match (a property comparison, a NOT, "*").
func (f *Filter) SkipsByTag() bool { return !f.cands().anyTag }

func (f *Filter) cands() *candidates {
	f.once.Do(func() {
		f.cand = f.root.cands()
		for _, fp := range f.cand.fps {
			lo := fp & -fp
			f.cand.pairs[bits.TrailingZeros32(lo)] |= fp &^ lo
		}
	})
	return &f.cand
}

// cands is the tags a message n holds for has: a tag names one; AND keeps
// what both allow; OR either; anything else (NOT, properties, "*") allows
// every tag.
func (n *fnode) cands() candidates {
	switch n.op {
	case fTag:
		return candidates{fps: []uint32{TagFingerprint(n.tag)}}
	case fOr:
		a, b := n.a.cands(), n.b.cands()
		if a.anyTag || b.anyTag {
			return candidates{anyTag: true}
		}
		return candidates{fps: union(a.fps, b.fps)}
	case fAnd:
		a, b := n.a.cands(), n.b.cands()
		switch {
		case a.anyTag:
			return b
		case b.anyTag:
			return a
		}
		var both []uint32
		for _, x := range a.fps {
			for _, y := range b.fps {
				if x == y {
					both = union(both, []uint32{x})
				}
			}
		}
		return candidates{fps: both}
	}
	return candidates{anyTag: true}
}

func union(a, b []uint32) []uint32 {
	out := append([]uint32(nil), a...)
	for _, y := range b {
		if !slices.Contains(out, y) {
			out = append(out, y)
		}
	}
	return out
}

// MatchEncoded is Match on one encoded message (as AppendMessage writes it
// and a broker stores it), reading only its tag and, when the filter asks,
// its properties: a broker judges the messages it reads without decoding
// them. A malformed message matches, so that its reader sees the error
// rather than lose the message (its index fingerprint is 0, though: a
// filter of tags skips it unread; a broker stores only messages that
// decode).
func (f *Filter) MatchEncoded(raw []byte) bool {
	r := reader{b: raw}
	tag := r.peekTag()
	props := r.b
	n := int(r.u16("property count"))
	if r.err != nil {
		return true
	}
	props = props[2:]
	prop := func(name string) (string, bool) {
		p := reader{b: props}
		for range n {
			k := p.span(int(p.u16("property key")), "property key")
			v := p.span(int(p.u16("property value")), "property value")
			if p.err != nil {
				return "", false
			}
			if string(k) == name {
				return unsafeString(v), true
			}
		}
		return "", false
	}
	return f.Match(unsafeString(tag), prop)
}

// unsafeString views b as a string without a copy: for the tag and values
// MatchEncoded hands the filter, which compares them and keeps none.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// peekTag reads an encoded message up to its tag and returns the tag
// (nil: none), leaving r at its properties.
func (r *reader) peekTag() []byte {
	rel := r.head()
	r.skipStamp(rel)
	if rel&scheduleFlag != 0 {
		r.span(scheduleSize, "schedule")
	}
	if rel&tagFlag == 0 {
		return nil
	}
	return r.span(int(r.u8("tag length")), "tag")
}

// EncodedTagFingerprint is TagFingerprint of one encoded message's tag (0
// for none or a malformed message): what a broker's queue index keeps.
func EncodedTagFingerprint(raw []byte) uint32 {
	r := reader{b: raw}
	tag := r.peekTag()
	if r.err != nil {
		return 0
	}
	return TagFingerprint(unsafeString(tag))
}

// QueueCountRequest is the body of QUEUE_COUNT (JSON): how many messages
// of a queue in [From, To) the filter (empty: every message) can take.
type QueueCountRequest struct {
	Topic  string `json:"topic"`
	Queue  uint32 `json:"queue"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	Filter string `json:"filter,omitempty"`
}

// QueueCount answers QUEUE_COUNT. The broker judges by its index alone
// (no message is read), so Count is at most: the messages whose tag's
// fingerprint the filter can take (Candidate). For a filter of tags alone
// it is exact but for tags that share a fingerprint (1 in 496); what a
// filter asks of properties is not judged. A scan stops after a bound of
// entries: ScannedTo is where it stopped (To when it did not).
type QueueCount struct {
	Count     int64 `json:"count"`
	ScannedTo int64 `json:"scanned_to"`
}
