package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// NodeStatus asks the one node at addr (an RPC address) for its own view of
// the Raft cluster: no other node is tried, and nothing is retried. The
// call ends with ctx or after timeout, whichever is first.
func (c *Client) NodeStatus(ctx context.Context, addr string, timeout time.Duration) (api.RaftStatus, error) {
	if addr == "" {
		return api.RaftStatus{}, errors.New("metaserver client: no RPC address known for the node")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tc, err := c.pool.Get(addr)
	if err != nil {
		return api.RaftStatus{}, err
	}
	resp, err := tc.Call(ctx, protocol.CodeAdminRaftStatus, []byte("{}"))
	if err != nil {
		return api.RaftStatus{}, err
	}
	var st api.RaftStatus
	if err := json.Unmarshal(resp.Body, &st); err != nil {
		return api.RaftStatus{}, fmt.Errorf("metaserver client: decode %T from %s: %w", st, addr, err)
	}
	return st, nil
}

// MetaStatus reads the Raft configuration from every address at once, each
// asked for at most perMember (a paused node costs perMember, not the
// call), and takes the leader's, else the one of the highest term and
// applied index; then it asks every member at its RPC address, all at once
// and each for at most perMember, for its own view. A member that does not
// answer is unreachable, with the error; its state is not guessed. The
// leader is the member that says it leads, at the highest term if two do;
// every member's AppliedBehind is measured against its applied index.
// When no address answered, the error is the one an ordinary call gets
// (which says when an address is not a metaserver).
func (c *Client) MetaStatus(ctx context.Context, perMember time.Duration) (api.MetaStatus, error) {
	cfg, ok := c.configuration(ctx, perMember)
	if !ok {
		var err error
		if cfg, err = c.RaftStatus(ctx); err != nil {
			return api.MetaStatus{}, err
		}
	}
	out := api.MetaStatus{Node: cfg.Node, Members: make([]api.MemberStatus, len(cfg.Members))}
	var wg sync.WaitGroup
	for i, m := range cfg.Members {
		out.Members[i] = api.MemberStatus{RaftMember: m, LastContactMillis: -1, AppliedBehind: -1}
		out.Members[i].Leader = false // the member's own word decides, below
		wg.Add(1)
		go func(ms *api.MemberStatus) {
			defer wg.Done()
			st, err := c.NodeStatus(ctx, ms.RPCAddr, perMember)
			if err == nil && st.Node != ms.ID {
				err = fmt.Errorf("the node at %s is %q, not %q", ms.RPCAddr, st.Node, ms.ID)
			}
			if err != nil {
				ms.Error = err.Error()
				return
			}
			ms.Reachable, ms.State, ms.Term = true, st.State, st.Term
			ms.LastIndex, ms.CommitIndex, ms.AppliedIndex = st.LastIndex, st.CommitIndex, st.AppliedIndex
			ms.LastContactMillis = st.LastContactMillis
		}(&out.Members[i])
	}
	wg.Wait()
	leader := -1
	for i, m := range out.Members {
		if m.Reachable && m.State == "Leader" && (leader < 0 || m.Term > out.Members[leader].Term) {
			leader = i
		}
	}
	if leader < 0 {
		return out, nil // no reachable member leads: no leader, no figures of one
	}
	l := &out.Members[leader]
	l.Leader = true
	out.LeaderID, out.LeaderAddr = l.ID, l.RPCAddr
	out.Term, out.LastIndex, out.CommitIndex, out.AppliedIndex = l.Term, l.LastIndex, l.CommitIndex, l.AppliedIndex
	for i := range out.Members {
		if m := &out.Members[i]; m.Reachable {
			m.AppliedBehind = int64(l.AppliedIndex) - int64(m.AppliedIndex)
		}
	}
	return out, nil
}

// configuration asks every address at once for its view of the Raft
// cluster, each for at most perMember, and returns the best answer: the
// leader's, else the one of the highest term, then applied index. ok is
// false when no address answered.
func (c *Client) configuration(ctx context.Context, perMember time.Duration) (best api.RaftStatus, ok bool) {
	answers := make([]*api.RaftStatus, len(c.cfg.Addrs))
	var wg sync.WaitGroup
	for i, addr := range c.cfg.Addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := c.NodeStatus(ctx, addr, perMember); err == nil {
				answers[i] = &st
			}
		}()
	}
	wg.Wait()
	better := func(a, b *api.RaftStatus) bool { // a over b
		if al, bl := a.State == "Leader", b.State == "Leader"; al != bl {
			return al
		}
		if a.Term != b.Term {
			return a.Term > b.Term
		}
		return a.AppliedIndex > b.AppliedIndex
	}
	for _, a := range answers {
		if a != nil && (!ok || better(a, &best)) {
			best, ok = *a, true
		}
	}
	return best, ok
}
