package broker

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// Every request code the broker serves is registered with its check, or
// listed as open (AUTH, IDENTIFY): a code added to the table without one,
// or open when it is not AUTH or IDENTIFY, fails here, and register (the
// only place that hands a transport server a handler, below) refuses it.
func TestEveryCodeIsCheckedOrOpen(t *testing.T) {
	served := map[protocol.Code]bool{}
	for _, e := range (&Broker{}).endpoints() {
		served[e.code] = true
		switch {
		case e.access.wrap == nil:
			t.Errorf("%v is registered with no access check", e.code)
		case e.access.open && !slices.Contains(openCodes, e.code):
			t.Errorf("%v is registered open; only %v may be", e.code, openCodes)
		case !e.access.open && !auth.HasRule(e.code):
			t.Errorf("%v is checked, but the permission table has no rule for it (only admin would pass)", e.code)
		}
	}
	for _, c := range openCodes {
		if !served[c] {
			t.Errorf("open code %v is not served", c)
		}
	}
	for _, e := range []endpoint{{code: protocol.CodeSend}, {code: protocol.CodeSend, access: open(func(*transport.Request) {})}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("register took %v with access %+v", e.code, e.access)
				}
			}()
			e.register(transport.NewServer(transport.ServerConfig{}), nil)
		}()
	}
}

// No file of the package hands a handler to a transport server but
// endpoint.register: a handler registered elsewhere would skip its check.
func TestOnlyRegisterRegistersHandlers(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	registering := []string{"Handle", "HandleWithReply", "HandleOrdered", "HandleOrderedInline"}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			inRegister := fn.Name.Name == "register" && fn.Recv != nil && recvType(fn.Recv) == "endpoint"
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && slices.Contains(registering, sel.Sel.Name) && !inRegister {
					t.Errorf("%s: %s registers a handler outside endpoint.register", fset.Position(call.Pos()), fn.Name.Name)
				}
				return true
			})
		}
	}
}

// recvType names a method's receiver type.
func recvType(recv *ast.FieldList) string {
	if len(recv.List) == 0 {
		return ""
	}
	if id, ok := recv.List[0].Type.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// With authorization on, every code but AUTH and IDENTIFY is refused to a
// principal with no permissions before its handler runs (the broker here
// has no parts: a handler reached would panic), NOT_AUTHORIZED naming the
// principal and the request; and BUSY while the broker has no permission
// table yet. (The servers here let an unauthenticated connection through,
// so the check alone stands between it and the handler.)
func TestCheckedCodesRefusedBeforeTheirHandler(t *testing.T) {
	clusterTok, noneTok := auth.NewToken(), auth.NewToken()
	sess := newSession("b1", nil, time.Second, 2*time.Second, clockwork.NewFakeClock(), hclog.NewNullLogger())
	acl := newACLCopy(clusterTok, nil, sess, hclog.NewNullLogger())
	b := &Broker{cfg: Config{ID: "b1", HAFetchBytes: 1 << 20}, acl: acl}
	addrs := map[port]string{}
	for _, p := range []port{dataPort, haPort} {
		srv := transport.NewServer(transport.ServerConfig{Workers: 2, Logger: hclog.NewNullLogger()})
		b.register(p, srv)
		a, err := srv.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		addrs[p] = a.String()
	}
	bodies := map[protocol.Code][]byte{
		protocol.CodeSend:       protocol.AppendSendRequest(nil, 0, []protocol.Message{{ID: "m", Topic: "orders", Timestamp: 1, Body: []byte("x")}}),
		protocol.CodePull:       protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: "orders", MaxBytes: 1024}),
		protocol.CodeQueueCount: []byte(`{"topic":"orders","to":10}`),
		protocol.CodeLookup:     []byte(`{"offset":0}`),
	}
	call := func(e endpoint, tok string) error {
		c := transport.NewClient(addrs[e.port], transport.ClientConfig{Login: auth.TokenLogin(tok)})
		defer func() { _ = c.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Call(ctx, e.code, bodies[e.code])
		return err
	}

	checked := 0
	for _, e := range b.endpoints() {
		if e.access.open {
			continue
		}
		checked++
		if err := call(e, ""); !errors.Is(err, protocol.ErrBusy) {
			t.Errorf("%v before the permission table is in: %v, want BUSY", e.code, err)
		}
	}
	if checked < 5 {
		t.Fatalf("only %d checked codes", checked)
	}

	table, err := auth.NewTable(1, []auth.Principal{{Name: "none", TokenHash: auth.HashToken(noneTok)}}, auth.Builtins{Cluster: auth.HashToken(clusterTok)})
	if err != nil {
		t.Fatal(err)
	}
	acl.table.Store(table)
	for _, e := range b.endpoints() {
		if e.access.open {
			continue
		}
		err := call(e, noneTok)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized || !strings.Contains(pe.Message, `principal "none" lacks `) ||
			!strings.Contains(pe.Message, e.code.String()) {
			t.Errorf("%v by a principal with no permissions: %v, want NOT_AUTHORIZED naming it and the request", e.code, err)
		}
	}
}
