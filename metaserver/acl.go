package metaserver

import (
	"context"
	"io"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// The access control list. Principals live in the registry (fsm/acl.go),
// applied through Raft on the leader; every node reads them from its own
// FSM. The built-in principals come from Config.Auth, per node.

// ACLChange is the outcome of an ACL change.
type ACLChange struct {
	// Changed is false when the command found nothing to do (the principal
	// was already so, or already absent).
	Changed bool
	// Version is the ACL version after the command.
	Version uint64
}

// SetPrincipal creates or replaces a principal: its token's SHA-256 (zero:
// none, a certificate-only principal) and permissions (texts,
// auth.ParsePermission). expectVersion, when not 0, must be the ACL
// version (CONFLICT otherwise). It returns once the change is committed
// and applied on this node. The node must lead (NOT_LEADER with the
// leader's address otherwise); a bad name or permission is INVALID and
// writes nothing to the log.
func (s *Server) SetPrincipal(ctx context.Context, name string, tokenHash auth.TokenHash, permissions []string, expectVersion uint64) (ACLChange, error) {
	if err := auth.ValidateName(name); err != nil {
		return ACLChange{}, invalid("%v", err)
	}
	perms, err := auth.ParsePermissions(permissions)
	if err != nil {
		return ACLChange{}, invalid("principal %q: %v", name, err)
	}
	res, err := s.applyACL(ctx, &fsm.SetPrincipal{Name: name, TokenHash: tokenHash, Permissions: auth.Strings(perms), ExpectVersion: expectVersion})
	if err != nil {
		return ACLChange{}, err
	}
	if res.Changed {
		s.log.Info("principal set", "principal", name, "permissions", auth.Strings(perms), "token", !tokenHash.IsZero(),
			"acl-version", res.Version)
	}
	return ACLChange{Changed: res.Changed, Version: res.Version}, nil
}

// RemovePrincipal removes a principal (an absent one: nothing changes).
// expectVersion and leadership as for SetPrincipal.
func (s *Server) RemovePrincipal(ctx context.Context, name string, expectVersion uint64) (ACLChange, error) {
	res, err := s.applyACL(ctx, &fsm.RemovePrincipal{Name: name, ExpectVersion: expectVersion})
	if err != nil {
		return ACLChange{}, err
	}
	if res.Changed {
		s.log.Info("principal removed", "principal", name, "acl-version", res.Version)
	}
	return ACLChange{Changed: res.Changed, Version: res.Version}, nil
}

func (s *Server) applyACL(ctx context.Context, cmd fsm.Command) (*fsm.Result, error) {
	if !s.started.Load() {
		return nil, &protocol.Error{Status: protocol.StatusBusy, Message: "metaserver node is starting"}
	}
	return s.apply(ctx, cmd)
}

// ACL is the table this node checks credentials and permissions against:
// the registry's principals as this node has applied them, and the
// built-ins of Config.Auth. It is an immutable snapshot; while the ACL
// does not change, calling ACL again returns the same table without a lock
// or an allocation, so a request may call it every time.
func (s *Server) ACL() *auth.Table { return s.fsm.ACL().WithBuiltins(s.cfg.Auth) }

// revokingFSM is the registry as raft applies it here: after a command or
// a snapshot restore that changed the ACL, the RPC port closes the
// connections whose principal is gone or whose token was replaced
// (dropRevoked), on every node, as it applies the change.
type revokingFSM struct {
	*fsm.FSM
	s *Server
}

func (f revokingFSM) Apply(l *raft.Log) any {
	v := f.ACLVersion()
	res := f.FSM.Apply(l)
	if f.ACLVersion() != v {
		f.s.dropRevoked()
	}
	return res
}

func (f revokingFSM) Restore(rc io.ReadCloser) error {
	err := f.FSM.Restore(rc)
	f.s.dropRevoked()
	return err
}

// dropRevoked closes the RPC connections whose principal this node's table
// no longer knows: each of their requests would be refused anyway, but the
// transport would still read their frames as a trusted peer's.
func (s *Server) dropRevoked() {
	if !s.cfg.AuthEnabled() {
		return
	}
	t := s.ACL()
	if n := s.rpc.DropConns(auth.Revoked(t), auth.ErrRevoked); n > 0 {
		s.log.Info("closed the connections of revoked credentials", "connections", n, "acl-version", t.Version())
	}
}
