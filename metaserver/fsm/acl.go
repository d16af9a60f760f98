package fsm

import (
	"fmt"
	"slices"
	"sort"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/protocol"
)

// The access control list: principals by name, each with its permissions
// (canonical texts, auth.ParsePermissions) and the SHA-256 of its token
// (zero: known by certificate only). The registry never holds a token.
// ACLVersion grows by one at every change of the principals, and only
// then: servers keep a copy of the table and poll the version. ACL
// commands do not move the registry Version (they change no route).
// The built-in principals (the bootstrap admin, the cluster) are never
// here: each server gets them from its own files.

// MaxPrincipals is the most principals the registry holds.
const MaxPrincipals = 10_000

// PrincipalRecord is a principal as the registry holds it. A record in the
// state is never modified: a change replaces it.
type PrincipalRecord struct {
	Name        string         `json:"name"`
	TokenHash   auth.TokenHash `json:"token_sha256"`
	Permissions []string       `json:"permissions"` // canonical: sorted, distinct, each one auth.ParsePermission reads back
}

// Principal returns the record as an auth.Principal. The record's
// permissions were checked when it was applied; one that no longer parses
// (a snapshot from a later version that knows more kinds) is left out, so
// it allows nothing.
func (r PrincipalRecord) Principal() auth.Principal {
	p := auth.Principal{Name: r.Name, TokenHash: r.TokenHash, Permissions: make([]auth.Permission, 0, len(r.Permissions))}
	for _, s := range r.Permissions {
		if q, err := auth.ParsePermission(s); err == nil {
			p.Permissions = append(p.Permissions, q)
		}
	}
	return p
}

// SetPrincipal creates a principal or replaces it whole: its token hash
// (zero: none) and permissions. The name must be valid
// (auth.ValidateName: not a built-in's), every permission must parse (the
// first that does not is named in an INVALID error, and nothing is
// applied), and no other principal may have the token (CONFLICT).
// ExpectVersion, when not 0, must be the ACL version (else CONFLICT), so
// that a read-modify-write (granting one more permission) does not undo a
// change made meanwhile. Setting what is there changes nothing, so a retry
// is harmless. The Result's Version is the ACL version after it.
type SetPrincipal struct {
	Name          string         `json:"name"`
	TokenHash     auth.TokenHash `json:"token_sha256"`
	Permissions   []string       `json:"permissions"`
	ExpectVersion uint64         `json:"expect_version,omitempty"`
}

// RemovePrincipal removes a principal; removing an absent one changes
// nothing. ExpectVersion as for SetPrincipal.
type RemovePrincipal struct {
	Name          string `json:"name"`
	ExpectVersion uint64 `json:"expect_version,omitempty"`
}

func (SetPrincipal) Type() CommandType    { return TypeSetPrincipal }
func (RemovePrincipal) Type() CommandType { return TypeRemovePrincipal }

func (f *FSM) checkACLVersion(expect uint64) error {
	if expect != 0 && expect != f.s.ACLVersion {
		return conflict("the ACL is at version %d, not %d", f.s.ACLVersion, expect)
	}
	return nil
}

func (f *FSM) setPrincipal(c *SetPrincipal) any {
	if err := auth.ValidateName(c.Name); err != nil {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()}
	}
	perms, err := auth.ParsePermissions(c.Permissions)
	if err != nil {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("principal %q: %v", c.Name, err)}
	}
	if err := f.checkACLVersion(c.ExpectVersion); err != nil {
		return err
	}
	s := f.s
	rec := &PrincipalRecord{Name: c.Name, TokenHash: c.TokenHash, Permissions: auth.Strings(perms)}
	old := s.Principals[c.Name]
	if old != nil && old.TokenHash == rec.TokenHash && slices.Equal(old.Permissions, rec.Permissions) {
		return &Result{Version: s.ACLVersion}
	}
	if old == nil && len(s.Principals) >= MaxPrincipals {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("the ACL holds %d principals, its limit", MaxPrincipals)}
	}
	if !rec.TokenHash.IsZero() {
		for _, other := range sortedPrincipals(s) {
			if other.Name != c.Name && other.TokenHash == rec.TokenHash {
				return conflict("principal %q has the same token; every principal needs its own", other.Name)
			}
		}
	}
	s.Principals[c.Name] = rec
	return f.bumpACL()
}

func (f *FSM) removePrincipal(c *RemovePrincipal) any {
	if err := f.checkACLVersion(c.ExpectVersion); err != nil {
		return err
	}
	if _, ok := f.s.Principals[c.Name]; !ok {
		return &Result{Version: f.s.ACLVersion}
	}
	delete(f.s.Principals, c.Name)
	return f.bumpACL()
}

func (f *FSM) bumpACL() *Result {
	f.s.ACLVersion++
	f.aclVersion.Store(f.s.ACLVersion)
	return &Result{Changed: true, Version: f.s.ACLVersion}
}

func sortedPrincipals(s *State) []*PrincipalRecord {
	out := make([]*PrincipalRecord, 0, len(s.Principals))
	for _, p := range s.Principals {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Principals returns copies of the ACL's principals, sorted by name.
func (f *FSM) Principals() []PrincipalRecord {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]PrincipalRecord, 0, len(f.s.Principals))
	for _, p := range sortedPrincipals(f.s) {
		p2 := *p
		p2.Permissions = slices.Clone(p.Permissions)
		out = append(out, p2)
	}
	return out
}

// ACLVersion is the ACL's version: 0 before any principal was set, then one
// more at every change. It reads no lock.
func (f *FSM) ACLVersion() uint64 { return f.aclVersion.Load() }

// ACL returns the registry's principals as an auth.Table at the current
// ACL version, without built-ins (a server adds its own with
// auth.Table.WithBuiltins). The table is built once per version: while
// the ACL does not change, ACL reads no lock and allocates nothing.
func (f *FSM) ACL() *auth.Table {
	if t := f.aclTable.Load(); t != nil && t.Version() == f.aclVersion.Load() {
		return t
	}
	f.mu.RLock()
	recs := sortedPrincipals(f.s)
	version := f.s.ACLVersion
	ps := make([]auth.Principal, 0, len(recs))
	for _, r := range recs {
		ps = append(ps, r.Principal())
	}
	f.mu.RUnlock()
	t, err := auth.NewTable(version, ps, auth.Builtins{})
	if err != nil {
		// Every record was checked when applied, and the token hashes
		// kept distinct: a snapshot that breaks this was not written by
		// this registry. Nobody from it is let in.
		t, _ = auth.NewTable(version, nil, auth.Builtins{})
	}
	f.aclTable.Store(t)
	return t
}
