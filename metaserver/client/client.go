package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// ErrNoNode is returned when no metaserver node could be reached. It is the
// client core's error of that name, so that the SDKs tell it apart.
var ErrNoNode = clientcore.ErrNoNode

// Config configures a Client.
type Config struct {
	// Addrs are the metaserver nodes' RPC addresses. Required.
	Addrs []string
	// CallTimeout bounds one call (all its retries) when the context has no
	// deadline. Default 5 s.
	CallTimeout time.Duration
	// Transport tunes the connections.
	Transport transport.ClientConfig
	// Token, when set, is presented on every connection (it sets
	// Transport.Token): a servers' cluster token, an admin's, or a
	// principal's that ferryctl acl add made.
	Token string
	// ActAs, with the cluster's Token only, names the principal the
	// requests are made for: the metaserver checks each JSON request as
	// that principal and stamps its audit record with it (the console's
	// certificate sessions; ActAsField). Any other caller naming one is
	// refused NOT_AUTHORIZED.
	ActAs string
	// ActProof is auth.ActorProof of ActAs: only a holder of the
	// metaservers' raft secret can make it (the console, in a metaserver).
	ActProof string
}

// Client is the typed metaserver client. Reads go to any node (the last one
// that answered first); writes and heartbeats go to the leader, following
// NOT_LEADER answers; a node that cannot be reached is skipped. It is safe
// for concurrent use.
type Client struct {
	cfg  Config
	pool *clientcore.Pool // one connection per node

	mu     sync.Mutex
	leader string          // last known leader RPC address
	good   string          // last node that answered a read
	slow   map[string]bool // addresses that did not answer within their attempt: tried after the others
	wrong  map[string]bool // addresses found not to be metaservers: tried last
}

// New returns a client; it dials lazily.
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("metaserver client: no addresses")
	}
	if cfg.CallTimeout < 0 {
		return nil, fmt.Errorf("metaserver client: CallTimeout must not be negative, got %v", cfg.CallTimeout)
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.Token != "" {
		cfg.Transport.Login = auth.TokenLogin(cfg.Token)
	}
	return &Client{cfg: cfg, pool: clientcore.NewPool(clientcore.PoolConfig{Transport: cfg.Transport}),
		slow: map[string]bool{}, wrong: map[string]bool{}}, nil
}

// Close closes every connection.
func (c *Client) Close() error { return c.pool.Close() }

// order returns the addresses to try, first the preferred one, then the
// others, then those that last did not answer within their attempt (a
// paused process), last those found not to be metaservers (they are asked
// again, in case one became one).
func (c *Client) order(preferLeader bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.good
	if preferLeader {
		first = c.leader
	}
	out := make([]string, 0, len(c.cfg.Addrs)+1)
	if first != "" {
		out = append(out, first)
	}
	var slow, wrong []string
	for _, a := range c.cfg.Addrs {
		switch {
		case a == first:
		case c.wrong[a]:
			wrong = append(wrong, a)
		case c.slow[a]:
			slow = append(slow, a)
		default:
			out = append(out, a)
		}
	}
	return append(append(out, slow...), wrong...)
}

// Bounds of one attempt at one address (see attemptBase).
const (
	maxFirstAttempt = time.Second
	minAttempt      = 50 * time.Millisecond
)

// attemptBase is how long the first pass of a call gives each address,
// out of the call's budget: an equal share, at most maxFirstAttempt and at
// least minAttempt (always bounded by what is left of the call). A
// process that accepts connections and answers nothing (SIGSTOPped, or
// wedged) then costs one share, and the other addresses are asked within
// the call's time. Each later pass doubles the attempt, so a node that is
// healthy but slower than a share (loaded) is given longer and longer,
// up to the whole of what is left. With one address there is nothing to
// move on to: it gets the whole call.
func attemptBase(budget time.Duration, addrs int) time.Duration {
	if addrs <= 1 {
		return budget
	}
	return max(min(budget/time.Duration(addrs), maxFirstAttempt), minAttempt)
}

// noteAnswered records that addr answered: it is no longer slow.
func (c *Client) noteAnswered(addr string) {
	c.mu.Lock()
	delete(c.wrong, addr)
	delete(c.slow, addr)
	c.mu.Unlock()
}

// noteSilent records that addr did not answer within its attempt: it is
// forgotten as the leader or the node to read from, and tried after the
// others until it answers again.
func (c *Client) noteSilent(addr string) {
	c.mu.Lock()
	if c.leader == addr {
		c.leader = ""
	}
	if c.good == addr {
		c.good = ""
	}
	c.slow[addr] = true
	c.mu.Unlock()
}

// call sends a request to the leader (toLeader) or to any node, retrying
// other nodes on connection errors and following NOT_LEADER. Each address
// gets its own bounded attempt (attemptBase, doubling on each pass), so one
// that takes connections and never answers does not eat the call's time;
// it is dropped as the leader and tried after the others from then on. An
// address that turns out not to be a metaserver (identify) is skipped for
// the rest of the call; when every address is one, the call fails at once
// with their WrongServerErrors (ErrNotMetaserver).
//
// A request whose attempt timed out may still be carried out by its node
// (as with a connection lost after the request went): a write retried
// elsewhere can meet its own effect (a topic that exists).
func (c *Client) call(ctx context.Context, code protocol.Code, req any, toLeader bool) ([]byte, error) {
	return c.callHeld(ctx, code, req, toLeader, 0)
}

// callHeld is call for a request the server may hold for up to hold
// before it answers (a long poll): each attempt, and the call's budget when
// ctx has no deadline, are longer by hold.
func (c *Client) callHeld(ctx context.Context, code protocol.Code, req any, toLeader bool, hold time.Duration) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.CallTimeout+hold)
		defer cancel()
	}
	body, ok := req.([]byte) // already encoded
	if !ok {
		var err error
		if body, err = json.Marshal(req); err != nil {
			return nil, fmt.Errorf("metaserver client: encode %v: %w", code, err)
		}
	}
	body = withActor(body, c.cfg.ActAs, c.cfg.ActProof)
	deadline, _ := ctx.Deadline()
	base := attemptBase(max(time.Until(deadline)-hold, 0), len(c.cfg.Addrs))
	var lastErr error
	var lastAnswer error // the last error a server answered with (BUSY, say): kept past later timeouts
	var wrong wrongServers
	// tlsBad: addresses whose handshake failed for the TLS settings
	// (transport.ErrTLSMismatch): asking again gives the same answer.
	tlsBad := map[string]error{}
	// refused: addresses that refused the client's login in this call
	// (made at the first refusal: most calls have none).
	var refused map[string]bool
	isWrong := func(addr string) bool {
		return slices.ContainsFunc(wrong, func(w *WrongServerError) bool { return w.Addr == addr }) || tlsBad[addr] != nil
	}
	backoff := 20 * time.Millisecond
	for round := 0; ; round++ {
		attempt := base<<min(round, 20) + hold
		silent := map[string]bool{} // addresses whose attempt timed out in this pass
		queue := c.order(toLeader)
		for len(queue) > 0 {
			addr := queue[0]
			queue = queue[1:]
			if isWrong(addr) || silent[addr] {
				continue
			}
			tc, err := c.pool.Get(addr)
			if err != nil {
				return nil, err
			}
			actx, cancel := context.WithTimeout(ctx, attempt)
			resp, err := tc.Call(actx, code, body)
			timedOut := err != nil && actx.Err() != nil && ctx.Err() == nil
			cancel()
			if err == nil {
				c.mu.Lock()
				if toLeader {
					c.leader = addr
				} else {
					c.good = addr
				}
				c.mu.Unlock()
				c.noteAnswered(addr)
				return resp.Body, nil
			}
			if errors.Is(err, transport.ErrTLSMismatch) && ctx.Err() == nil {
				tlsBad[addr] = err
				if !slices.ContainsFunc(c.cfg.Addrs, func(a string) bool { return !isWrong(a) }) {
					// No address is left that could answer: the cause is
					// known now, and waiting out the call would not change it.
					return nil, tlsMismatch(c.cfg.Addrs, tlsBad)
				}
				lastErr = err
				continue
			}
			if timedOut {
				// Taken, not answered in its share: a paused or wedged
				// process, or a loaded one (the next pass gives it longer).
				silent[addr] = true
				c.noteSilent(addr)
				lastErr = err
				continue
			}
			if suspect(err) && ctx.Err() == nil {
				ictx, icancel := context.WithTimeout(ctx, attempt)
				w := identify(ictx, tc, addr, code, err)
				icancel()
				if w != nil {
					wrong = append(wrong, w)
					c.mu.Lock()
					c.wrong[addr] = true
					c.mu.Unlock()
					if !slices.ContainsFunc(c.cfg.Addrs, func(a string) bool { return !isWrong(a) }) {
						return nil, wrong
					}
					continue
				}
			}
			lastErr = err
			var pe *protocol.Error
			if errors.As(err, &pe) && !errors.Is(err, protocol.ErrTimeout) {
				lastAnswer = err
			}
			if errors.Is(err, protocol.ErrNotLeader) {
				// A node that is not the leader answered: it is alive.
				c.noteAnswered(addr)
				if leader := string(resp.Body); leader != "" && !silent[leader] {
					c.mu.Lock()
					c.leader = leader
					c.mu.Unlock()
					if leader != addr {
						queue = append([]string{leader}, queue...)
					}
				}
				continue
			}
			if ctx.Err() != nil {
				if lastAnswer != nil && lastAnswer != err {
					return nil, fmt.Errorf("%w: %v after %d rounds: %w (before that: %w)", ErrNoNode, code, round+1, err, lastAnswer)
				}
				return nil, fmt.Errorf("metaserver client: %v: %w", code, err)
			}
			var le *transport.LoginError
			if errors.As(err, &le) && !slices.ContainsFunc(c.cfg.Addrs, func(a string) bool { return a != addr && !isWrong(a) && !refused[a] }) {
				return nil, err // every node refused the credential
			}
			if errors.As(err, &le) {
				// A node that has not yet applied a new principal refuses
				// its token: ask the others, the leader among them.
				if refused == nil {
					refused = map[string]bool{}
				}
				refused[addr] = true
				continue
			}
			if errors.As(err, &pe) && !pe.Retriable() {
				return nil, err // the cluster answered: no other node will say otherwise
			}
			// A connection error, BUSY or SHUTTING_DOWN: try the next node.
		}
		// Every node tried: wait (an election may be under way) and go again.
		select {
		case <-ctx.Done():
			if lastAnswer != nil && lastAnswer != lastErr {
				lastErr = fmt.Errorf("%w (before that: %w)", lastErr, lastAnswer)
			}
			if len(wrong) > 0 {
				// Say why the addresses that answered were no help; the
				// error is still ErrNoNode's: the others may be metaservers.
				return nil, fmt.Errorf("%w: %v after %d rounds: %w (and %v)", ErrNoNode, code, round+1, lastErr, wrong)
			}
			return nil, fmt.Errorf("%w: %v after %d rounds: %w", ErrNoNode, code, round+1, lastErr)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// tlsMismatch is the error of a call that no address could take for the
// TLS settings: the first address's handshake error (it names the address
// and the cause), and how many others failed so.
func tlsMismatch(addrs []string, bad map[string]error) error {
	var first error
	for _, a := range addrs {
		if first = bad[a]; first != nil {
			break
		}
	}
	if len(bad) > 1 {
		return fmt.Errorf("%w (and %d other addresses the same way)", first, len(bad)-1)
	}
	return first
}

func decode[T any](b []byte, err error) (T, error) {
	var v T
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("metaserver client: decode %T: %w", v, err)
	}
	return v, nil
}

// Heartbeat sends a broker's heartbeat to the leader.
func (c *Client) Heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	return decode[api.HeartbeatReply](c.call(ctx, protocol.CodeHeartbeat, hb, true))
}

// WatchRoutes is a broker's long poll for the topics routed to its group
// (ROUTE_WATCH, to the leader): the leader answers when one changed after
// w.Version, or after w.WaitMillis.
func (c *Client) WatchRoutes(ctx context.Context, w api.RouteWatch) (api.RouteWatchReply, error) {
	hold := time.Duration(w.WaitMillis) * time.Millisecond
	return decode[api.RouteWatchReply](c.callHeld(ctx, protocol.CodeRouteWatch, w, true, hold))
}

// Route looks a topic's route up on any node. An unknown topic with
// auto-create off returns protocol.ErrUnknownTopic.
func (c *Client) Route(ctx context.Context, topic string) (routing.Route, error) {
	return c.route(ctx, protocol.CodeRouteLookup, topic, false)
}

// RouteExisting looks a topic's route up and never creates the topic: an
// unknown topic returns protocol.ErrUnknownTopic. Brokers use it to check
// where a queue belongs.
//
// It asks the last known leader first: a broker (which learns the leader
// from its heartbeats) then sees a topic as soon as its creation committed,
// where a follower may not have applied it yet.
func (c *Client) RouteExisting(ctx context.Context, topic string) (routing.Route, error) {
	return c.route(ctx, protocol.CodeRouteGet, topic, true)
}

func (c *Client) route(ctx context.Context, code protocol.Code, topic string, leaderFirst bool) (routing.Route, error) {
	if c.cfg.ActAs != "" {
		// A route request's body is the topic's name, with no room for an
		// actor: it would be checked as the cluster, not as ActAs.
		return routing.Route{}, fmt.Errorf("metaserver client: a client acting for %q cannot look routes up (%v carries no actor)", c.cfg.ActAs, code)
	}
	body, err := c.call(ctx, code, []byte(topic), leaderFirst)
	if err != nil {
		return routing.Route{}, err
	}
	return routing.DecodeRoute(body)
}

// InitProducer asks the leader for a producer identity: name "" for an
// anonymous producer (a fresh id at epoch 0), or the producer's name (its
// id, at an epoch above every earlier instance's). A call whose outcome was
// unknown and was retried may have skipped an id or an epoch; none is ever
// handed out twice.
func (c *Client) InitProducer(ctx context.Context, name string) (api.InitProducerReply, error) {
	if err := checkUTF8(producerName, name); err != nil {
		return api.InitProducerReply{}, err
	}
	return decode[api.InitProducerReply](c.call(ctx, protocol.CodeInitProducer, api.InitProducerRequest{Name: name}, true))
}

// Groups lists the broker groups with their heartbeats (from the leader).
func (c *Client) Groups(ctx context.Context) ([]api.GroupInfo, error) {
	return decode[[]api.GroupInfo](c.call(ctx, protocol.CodeAdminGroups, struct{}{}, true))
}

// Topics lists the topics (from any node).
func (c *Client) Topics(ctx context.Context) ([]routing.Topic, error) {
	return decode[[]routing.Topic](c.call(ctx, protocol.CodeAdminTopics, struct{}{}, false))
}

// CreateTopic creates a topic and returns its route.
func (c *Client) CreateTopic(ctx context.Context, req api.CreateTopicRequest) (routing.Route, error) {
	if err := checkUTF8(topicName, req.Name); err != nil {
		return routing.Route{}, err
	}
	return decode[routing.Route](c.call(ctx, protocol.CodeAdminCreateTopic, req, true))
}

// AddQueues adds queues to a topic and returns its route.
func (c *Client) AddQueues(ctx context.Context, topic string, count int) (routing.Route, error) {
	if err := checkUTF8(topicName, topic); err != nil {
		return routing.Route{}, err
	}
	return decode[routing.Route](c.call(ctx, protocol.CodeAdminAddQueues, api.AddQueuesRequest{Topic: topic, Count: count}, true))
}

// SetGroupReadOnly marks a group read-only (sticky) or clears that mark.
func (c *Client) SetGroupReadOnly(ctx context.Context, group string, readOnly bool) (routing.Group, error) {
	return decode[routing.Group](c.call(ctx, protocol.CodeAdminSetGroupMode, api.SetGroupModeRequest{Group: group, ReadOnly: readOnly}, true))
}

// ResyncBroker orders a broker that is not its group's master to set its
// log aside and copy it again from its master; it returns the group with
// the order.
func (c *Client) ResyncBroker(ctx context.Context, broker string) (routing.Group, error) {
	return decode[routing.Group](c.call(ctx, protocol.CodeAdminResync, api.ResyncBrokerRequest{Broker: broker}, true))
}

// RaftStatus returns the Raft cluster as the leader (or, without one, any
// node) sees it.
func (c *Client) RaftStatus(ctx context.Context) (api.RaftStatus, error) {
	return decode[api.RaftStatus](c.call(ctx, protocol.CodeAdminRaftStatus, struct{}{}, false))
}

// AddVoter adds a metaserver node as a voter.
func (c *Client) AddVoter(ctx context.Context, req api.VoterRequest) (api.RaftStatus, error) {
	return decode[api.RaftStatus](c.call(ctx, protocol.CodeAdminAddVoter, req, true))
}

// RemoveVoter removes a metaserver node.
func (c *Client) RemoveVoter(ctx context.Context, id string) (api.RaftStatus, error) {
	return decode[api.RaftStatus](c.call(ctx, protocol.CodeAdminRemoveVoter, api.VoterRequest{ID: id}, true))
}

// ConsumerHeartbeat joins, keeps or (Leave) leaves a consumer group, and
// returns the member's assignment in the group's current generation (leader).
func (c *Client) ConsumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error) {
	if err := checkUTF8(groupName, hb.Group); err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	if err := checkUTF8(memberName, hb.Member); err != nil {
		return api.ConsumerHeartbeatReply{}, err
	}
	for _, t := range hb.Topics {
		if err := checkUTF8(topicName, t); err != nil {
			return api.ConsumerHeartbeatReply{}, err
		}
	}
	return decode[api.ConsumerHeartbeatReply](c.call(ctx, protocol.CodeConsumerHeartbeat, hb, true))
}

// CommitOffsets commits a member's offsets in its generation (leader); a
// stale generation gets protocol.ErrStaleGeneration.
func (c *Client) CommitOffsets(ctx context.Context, req api.CommitRequest) (api.CommitReply, error) {
	return decode[api.CommitReply](c.call(ctx, protocol.CodeCommitOffsets, req, true))
}

// ConsumerGroups lists the consumer groups, or the one named (leader).
func (c *Client) ConsumerGroups(ctx context.Context, group string) ([]api.ConsumerGroupInfo, error) {
	if err := checkUTF8(groupName, group); err != nil {
		return nil, err
	}
	return decode[[]api.ConsumerGroupInfo](c.call(ctx, protocol.CodeConsumerGroups, api.ConsumerGroupsRequest{Group: group}, true))
}

// DeleteConsumerGroup removes a consumer group and its committed offsets; a
// group with live members is refused GROUP_ACTIVE.
func (c *Client) DeleteConsumerGroup(ctx context.Context, group string) error {
	_, err := c.call(ctx, protocol.CodeDeleteGroup, api.DeleteGroupRequest{Group: group}, true)
	return err
}

// SetGroupFilter sets the filter ("*": every message) of the messages a
// consumer group receives; its members take it from their next heartbeat.
func (c *Client) SetGroupFilter(ctx context.Context, group, filter string) (api.ConsumerGroupInfo, error) {
	return decode[api.ConsumerGroupInfo](c.call(ctx, protocol.CodeSetGroupFilter, api.SetGroupFilterRequest{Group: group, Filter: filter}, true))
}

// ResetOffsets sets a group's committed offsets; a group with live members
// gets protocol.ErrGroupActive (leader).
func (c *Client) ResetOffsets(ctx context.Context, req api.ResetOffsetsRequest) (api.ConsumerGroupInfo, error) {
	if err := checkUTF8(groupName, req.Group); err != nil {
		return api.ConsumerGroupInfo{}, err
	}
	return decode[api.ConsumerGroupInfo](c.call(ctx, protocol.CodeResetOffsets, req, true))
}
