package client

import (
	"context"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// DecideTxn asks the registry to decide a transaction (leader). The answer
// is the transaction's decision: this one, or the one recorded before,
// which wins whatever req asks (Committed says which). A decision with
// offsets whose commit is refused records nothing: the error is the
// commit's (e.g. protocol.ErrStaleGeneration), and the transaction is
// still undecided. Asking again is harmless.
func (c *Client) DecideTxn(ctx context.Context, req api.TxnDecideRequest) (api.TxnDecision, error) {
	return decode[api.TxnDecision](c.call(ctx, protocol.CodeTxnDecide, req, true))
}

// TxnDone reports that req.Groups applied a transaction's decision
// (leader); the registry forgets the decision once every group it names
// reported. Reporting again, or about a decision forgotten, is harmless.
func (c *Client) TxnDone(ctx context.Context, req api.TxnDoneRequest) error {
	_, err := c.call(ctx, protocol.CodeTxnDone, req, true)
	return err
}

// TxnDecisions lists the decisions the registry holds (leader), oldest
// first.
func (c *Client) TxnDecisions(ctx context.Context, req api.TxnDecisionsRequest) (api.TxnDecisions, error) {
	return decode[api.TxnDecisions](c.call(ctx, protocol.CodeTxnDecisions, req, true))
}
