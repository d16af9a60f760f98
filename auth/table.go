package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
)

// TokenHash is the SHA-256 of a token: all the registry keeps of it. Its
// text form (JSON too) is lowercase hex; the zero hash, "no token" (a
// principal known only by its certificate), is "".
type TokenHash [sha256.Size]byte

// HashToken returns the hash of token.
func HashToken(token string) TokenHash { return sha256.Sum256([]byte(token)) }

// IsZero reports whether h is the zero hash (no token).
func (h TokenHash) IsZero() bool { return h == TokenHash{} }

// String is h in hex, "" for the zero hash.
func (h TokenHash) String() string {
	if h.IsZero() {
		return ""
	}
	return hex.EncodeToString(h[:])
}

// MarshalText is String.
func (h TokenHash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText reads 64 hex digits, or "" for the zero hash.
func (h *TokenHash) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*h = TokenHash{}
		return nil
	}
	var v TokenHash
	if len(b) != 2*len(v) {
		return fmt.Errorf("token hash: want %d hex digits (SHA-256), got %d characters", 2*len(v), len(b))
	}
	if _, err := hex.Decode(v[:], b); err != nil {
		return fmt.Errorf("token hash: %w", err)
	}
	*h = v
	return nil
}

// Token lengths ValidateToken accepts.
const (
	MinTokenLen = 32
	MaxTokenLen = 512
)

// NewToken returns a fresh token: 32 random bytes in unpadded base64url
// (43 characters). Show it once, keep HashToken of it.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+); it crashes the program instead
	return base64.RawURLEncoding.EncodeToString(b)
}

// MinTokenBits is the least strength ValidateToken takes, estimated as a
// token's length times log2 of the alphabet its character classes span.
const MinTokenBits = 128

// minTokenDistinct is the fewest distinct characters a token may hold.
const minTokenDistinct = 8

// ValidateToken checks a token that a person may have made (the bootstrap
// admin's, the cluster's, a raft secret): MinTokenLen to MaxTokenLen
// printable ASCII characters without spaces, so that it survives a file, a
// flag and an environment variable unchanged; at least minTokenDistinct
// distinct characters; not a piece repeated (a period of at most half its
// length, as "passwordpassword..."); and at least MinTokenBits strong,
// estimated as its length times log2 of the alphabet its character classes
// span (digits 10, lower case 26, upper case 26, other printable 32). So 32
// random hex digits (about 165 bits by the estimate, 128 in truth) and
// NewToken's tokens pass; 32 x "a" does not.
func ValidateToken(token string) error {
	if len(token) < MinTokenLen || len(token) > MaxTokenLen {
		return fmt.Errorf("a token must be %d to %d characters, got %d (make one with 32 random bytes in base64)",
			MinTokenLen, MaxTokenLen, len(token))
	}
	var seen [128]bool
	distinct, classes := 0, [4]bool{}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c <= ' ' || c > '~' {
			return fmt.Errorf("a token may hold only printable ASCII characters without spaces; character %d is not", i+1)
		}
		if !seen[c] {
			seen[c], distinct = true, distinct+1
		}
		switch {
		case c >= '0' && c <= '9':
			classes[0] = true
		case c >= 'a' && c <= 'z':
			classes[1] = true
		case c >= 'A' && c <= 'Z':
			classes[2] = true
		default:
			classes[3] = true
		}
	}
	const hint = " (make one with 32 random bytes in base64: openssl rand -base64 32)"
	if distinct < minTokenDistinct {
		return fmt.Errorf("a token must hold at least %d distinct characters; this one has %d"+hint, minTokenDistinct, distinct)
	}
	for p := 1; p <= len(token)/2; p++ {
		if token[p:] == token[:len(token)-p] {
			return fmt.Errorf("a token must not repeat a piece of itself; this one repeats its first %d characters"+hint, p)
		}
	}
	alphabet := 0
	for k, size := range [4]int{10, 26, 26, 32} {
		if classes[k] {
			alphabet += size
		}
	}
	if bits := float64(len(token)) * math.Log2(float64(alphabet)); bits < MinTokenBits {
		return fmt.Errorf("a token must be at least %d bits strong, estimated as its length times log2 of the alphabet its "+
			"character classes span: this one has %d characters of an alphabet of %d, about %.0f bits"+hint,
			MinTokenBits, len(token), alphabet, bits)
	}
	return nil
}

// ParseToken reads a token file's contents: the token, with the spaces and
// line ends around it cut, checked by ValidateToken.
func ParseToken(b []byte) (string, error) {
	t := strings.TrimSpace(string(b))
	if err := ValidateToken(t); err != nil {
		return "", err
	}
	return t, nil
}

// Principal is someone who may act: a name, its permissions, and for a
// token principal the hash of its token.
type Principal struct {
	Name        string
	Permissions []Permission // canonical (ParsePermissions); never modified once in a Table
	TokenHash   TokenHash    // zero: no token (known by certificate only)
	// BuiltIn marks the bootstrap admin and the cluster, which are not in
	// the registry.
	BuiltIn bool
}

// Has reports whether p holds exactly the permission q (not whether q's
// rights are covered by others: see Authorize).
func (p Principal) Has(q Permission) bool { return slices.Contains(p.Permissions, q) }

// IsAdmin reports whether p holds admin.
func (p Principal) IsAdmin() bool { return p.Has(Admin) }

// Builtins are the built-in principals' token hashes, from files the
// servers are given (the zero hash: no such principal). The bootstrap admin
// (named AdminName) holds admin, the cluster (ClusterName) holds cluster.
type Builtins struct {
	Admin   TokenHash
	Cluster TokenHash
}

// Validate refuses built-ins that share a token.
func (b Builtins) Validate() error {
	if !b.Admin.IsZero() && b.Admin == b.Cluster {
		return fmt.Errorf("the bootstrap admin and the cluster have the same token")
	}
	return nil
}

// Table is an immutable snapshot of the principals a server knows: the
// registry's at one ACL version, and the built-ins. Its methods read no
// lock; share one by pointer and swap it whole when the registry moves.
type Table struct {
	version uint64
	byName  map[string]*Principal // the registry's principals
	byHash  map[TokenHash]*Principal
	list    []Principal // sorted by name
	admin   *Principal
	cluster *Principal
	// memo is the last WithBuiltins result, so that a server asking for
	// the current table at every request builds it once per ACL version.
	memo atomic.Pointer[Table]
}

// NewTable builds a table from the registry's principals at ACL version
// version, and the built-ins. The principals must have valid, distinct
// names and distinct token hashes (the registry guarantees both). A
// principal whose token hash is a built-in's is not found by that token:
// the built-in is (whoever holds the admin's token is the admin). The
// table keeps the principals' Permissions slices.
func NewTable(version uint64, principals []Principal, b Builtins) (*Table, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	t := &Table{version: version, byName: make(map[string]*Principal, len(principals)),
		byHash: make(map[TokenHash]*Principal, len(principals))}
	for _, p := range principals {
		if err := ValidateName(p.Name); err != nil {
			return nil, err
		}
		if t.byName[p.Name] != nil {
			return nil, fmt.Errorf("principal %q is listed twice", p.Name)
		}
		p.BuiltIn = false
		pp := &p
		t.byName[p.Name] = pp
		if !p.TokenHash.IsZero() {
			if q := t.byHash[p.TokenHash]; q != nil {
				return nil, fmt.Errorf("principals %q and %q have the same token", q.Name, p.Name)
			}
			t.byHash[p.TokenHash] = pp
		}
		t.list = append(t.list, p)
	}
	slices.SortFunc(t.list, func(a, b Principal) int { return strings.Compare(a.Name, b.Name) })
	t.admin, t.cluster = builtins(b)
	return t, nil
}

func builtins(b Builtins) (admin, cluster *Principal) {
	if !b.Admin.IsZero() {
		admin = &Principal{Name: AdminName, Permissions: []Permission{Admin}, TokenHash: b.Admin, BuiltIn: true}
	}
	if !b.Cluster.IsZero() && b.Cluster != b.Admin {
		cluster = &Principal{Name: ClusterName, Permissions: []Permission{Cluster}, TokenHash: b.Cluster, BuiltIn: true}
	}
	return admin, cluster
}

// WithBuiltins returns t with the built-ins b instead of its own (t's
// registry principals, shared). Built-ins that share a token make the
// admin only (Builtins.Validate refuses them). The result for the last b
// is kept, so calling it for every request costs no allocation while t and
// b stay the same.
func (t *Table) WithBuiltins(b Builtins) *Table {
	if m := t.memo.Load(); m != nil && m.builtins() == b {
		return m
	}
	m := &Table{version: t.version, byName: t.byName, byHash: t.byHash, list: t.list}
	m.admin, m.cluster = builtins(b)
	t.memo.Store(m)
	return m
}

// builtins returns the table's built-ins' hashes.
func (t *Table) builtins() Builtins {
	var b Builtins
	if t.admin != nil {
		b.Admin = t.admin.TokenHash
	}
	if t.cluster != nil {
		b.Cluster = t.cluster.TokenHash
	}
	return b
}

// Version is the registry's ACL version the table was built from.
func (t *Table) Version() uint64 { return t.version }

// Authenticate returns the principal whose token is token. It hashes the
// token and looks the hash up, so its time depends on the token's length
// only, not on how much of it matches a stored token (and the table holds
// no token to compare with).
func (t *Table) Authenticate(token string) (Principal, bool) {
	return t.AuthenticateHash(HashToken(token))
}

// AuthenticateHash is Authenticate for a token already hashed (a
// connection that keeps its token's hash to look it up again in a newer
// table).
func (t *Table) AuthenticateHash(h TokenHash) (Principal, bool) {
	if h.IsZero() {
		return Principal{}, false
	}
	for _, p := range []*Principal{t.admin, t.cluster} {
		if p != nil && subtle.ConstantTimeCompare(h[:], p.TokenHash[:]) == 1 {
			return *p, true
		}
	}
	if p := t.byHash[h]; p != nil {
		return *p, true
	}
	return Principal{}, false
}

// Lookup returns the registry principal named name: the identity a TLS
// client certificate names (its Subject CN) maps to. The built-ins are
// known by token only, never by name.
func (t *Table) Lookup(name string) (Principal, bool) {
	if p := t.byName[name]; p != nil {
		return *p, true
	}
	return Principal{}, false
}

// Principals returns the registry's principals, sorted by name (not the
// built-ins). The slice is the table's: do not modify it.
func (t *Table) Principals() []Principal { return t.list }

// HasAdmin and HasCluster report whether the table has the built-ins.
func (t *Table) HasAdmin() bool   { return t.admin != nil }
func (t *Table) HasCluster() bool { return t.cluster != nil }

// ActorProof is what a request naming an actor (the web console's, for a
// certificate session) carries besides the actor's name: an HMAC of the
// name under a key derived from the metaservers' own raft secret, which no
// broker or client holds. So holding the cluster token, which every server
// has, is not enough to act for another principal.
func ActorProof(raftSecret, actor string) string {
	key := hmac.New(sha256.New, []byte(raftSecret))
	key.Write([]byte("ferrymq act_as v1"))
	m := hmac.New(sha256.New, key.Sum(nil))
	m.Write([]byte(actor))
	return hex.EncodeToString(m.Sum(nil))
}
