package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/wire"
)

func (c *Client) admin(ctx context.Context) (context.Context, error) {
	if c.cfg.AdminToken == "" {
		return nil, errors.New("client: registering an identity needs the administrator's token")
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.cfg.AdminToken), nil
}

// RegisterCertificate enrols the client's certificate (administrator
// only); in Auditor mode with the Auditor too, and the error joins both
// domains'. Repeating the same registration succeeds, so a retry after
// one domain failed completes it.
func (c *Client) RegisterCertificate(ctx context.Context) error {
	if len(c.cfg.CertificatePEM) == 0 {
		return errors.New("client: no certificate configured")
	}
	ctx, err := c.admin(ctx)
	if err != nil {
		return err
	}
	req := &api.RegisterCertificateRequest{Entity: c.cfg.Entity, KeyVersion: c.cfg.KeyVersion, CertificatePem: string(c.cfg.CertificatePEM)}
	_, _, err = call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return t.api.RegisterCertificate(ctx, req, o...)
	})
	return registerWithAuditor(ctx, c, true, err, func(ctx context.Context, a api.AuditorClient, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return a.RegisterCertificate(ctx, req, o...)
	})
}

// RegisterSecret enrols the client's HMAC secret (administrator only);
// in Auditor mode with the Auditor too, as RegisterCertificate.
func (c *Client) RegisterSecret(ctx context.Context) error {
	if len(c.cfg.Secret) == 0 {
		return errors.New("client: no secret configured")
	}
	ctx, err := c.admin(ctx)
	if err != nil {
		return err
	}
	req := &api.RegisterSecretRequest{Entity: c.cfg.Entity, KeyVersion: c.cfg.KeyVersion, Secret: c.cfg.Secret}
	_, _, err = call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return t.api.RegisterSecret(ctx, req, o...)
	})
	return registerWithAuditor(ctx, c, true, err, func(ctx context.Context, a api.AuditorClient, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return a.RegisterSecret(ctx, req, o...)
	})
}

// RegisterContract registers Starlark source under id, signed; in
// Auditor mode with the Auditor too, the same signed registration, as
// RegisterCertificate.
func (c *Client) RegisterContract(ctx context.Context, id string, source []byte) error {
	if err := c.needSigner(); err != nil {
		return err
	}
	reg := &proof.ContractRegistration{ID: id, Source: source, Entity: c.cfg.Entity, KeyVersion: c.cfg.KeyVersion}
	sig, err := proof.Sign(c.signer, reg)
	if err != nil {
		return err
	}
	req := &api.RegisterContractRequest{ContractId: id, Source: source, Entity: c.cfg.Entity, KeyVersion: c.cfg.KeyVersion, Signature: sig}
	_, _, err = call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return t.api.RegisterContract(ctx, req, o...)
	})
	return registerWithAuditor(ctx, c, false, err, func(ctx context.Context, a api.AuditorClient, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return a.RegisterContract(ctx, req, o...)
	})
}

// ListContracts lists the built-in and registered contracts.
func (c *Client) ListContracts(ctx context.Context) ([]*api.ContractInfo, error) {
	r, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.ListContractsReply, error) {
		return t.api.ListContracts(ctx, &api.ListContractsRequest{}, o...)
	})
	if err != nil {
		return nil, err
	}
	return r.Contracts, nil
}

// NewRequest builds and signs a request with a fresh nonce.
func (c *Client) NewRequest(contractID string, argument []byte) (*proof.Request, error) {
	if err := c.needSigner(); err != nil {
		return nil, err
	}
	return c.SignRequest(&proof.Request{Nonce: NewNonce(), ContractID: contractID, Argument: argument})
}

// SignRequest fills in the client's identity and signs r, keeping its
// nonce, contract and argument.
func (c *Client) SignRequest(r *proof.Request) (*proof.Request, error) {
	if err := c.needSigner(); err != nil {
		return nil, err
	}
	r.Entity, r.KeyVersion = c.cfg.Entity, c.cfg.KeyVersion
	sig, err := proof.Sign(c.signer, r)
	if err != nil {
		return nil, err
	}
	r.Signature = sig
	return r, nil
}

// Execute runs contractID with a JSON argument under a fresh nonce.
func (c *Client) Execute(ctx context.Context, contractID string, argument []byte) (*proof.Result, error) {
	r, err := c.NewRequest(contractID, argument)
	if err != nil {
		return nil, err
	}
	return c.ExecuteRequest(ctx, r)
}

// ExecuteRequest sends a signed request, retrying it (same nonce) while
// replies are lost, and recovering the outcome from the ledger's recorded
// state if a retry finds the nonce used. In Auditor mode it is
// ExecuteAudited: the result comes back only with the Auditor's verified
// approval.
func (c *Client) ExecuteRequest(ctx context.Context, r *proof.Request) (*proof.Result, error) {
	if c.aud != nil {
		res, _, err := c.ExecuteAudited(ctx, r)
		return res, err
	}
	return c.ExecuteOrdered(ctx, r, nil)
}

// ExecuteOrdered is ExecuteRequest's call of the ledger, with tok, the
// Auditor's order token for r, if not nil: what Auditor mode sends
// between Ordering and Validation. A ledger that runs with an Auditor
// refuses a request without its valid token (proof.ErrOrderToken); one
// that does not ignores the token.
func (c *Client) ExecuteOrdered(ctx context.Context, r *proof.Request, tok *proof.OrderToken) (*proof.Result, error) {
	req := wire.RequestToAPI(r)
	req.OrderToken = wire.OrderTokenToAPI(tok)
	reply, attempts, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.ExecuteReply, error) {
		return viaMux(ctx, t, &api.CallRequest{Call: &api.CallRequest_Execute{Execute: req}}, (*api.CallReply).GetExecute,
			func(ctx context.Context, o ...grpc.CallOption) (*api.ExecuteReply, error) {
				return t.api.ExecuteContract(ctx, req, o...)
			}, o)
	})
	if err != nil {
		if attempts > 0 && errors.Is(err, proof.ErrNonceReused) {
			return c.recover(ctx, r)
		}
		return nil, err
	}
	return wire.ResultFromAPI(reply)
}

// recover rebuilds the outcome of a request whose reply was lost. The
// nonce may have been used before by another request (a caller-chosen
// nonce, or another entity's): an outcome recorded for another contract
// is not this one's, and a committed transaction that wrote is this
// request's only if the versions it wrote record this request (sameRequest).
// A transaction that wrote nothing, or aborted, records no more of its
// request than the contract, so for those an outcome of another request
// to the same contract under the nonce cannot be told from this one's;
// either way, this request itself did not write.
func (c *Client) recover(ctx context.Context, r *proof.Request) (*proof.Result, error) {
	nonce := r.Nonce
	st, err := c.TxState(ctx, nonce)
	if err != nil {
		return nil, err
	}
	if st.Status != proof.TxUnknown && st.Contract != r.ContractID {
		return nil, nonceUsed(nonce, fmt.Sprintf("a request to %s, not %s", st.Contract, r.ContractID))
	}
	switch st.Status {
	case proof.TxCommitted:
		res, err := c.CommittedResult(ctx, st)
		if err != nil {
			return nil, err
		}
		if err := c.sameRequest(ctx, r, res); err != nil {
			return nil, err
		}
		return res, nil
	case proof.TxAborted:
		if s := proof.KindError(st.Kind); s != nil {
			return nil, &Error{Code: wire.Code(st.Kind), Kind: st.Kind, Msg: st.Reason, sentinel: s}
		}
		return nil, fmt.Errorf("client: transaction %s aborted: %s", nonce, st.Reason)
	}
	return nil, fmt.Errorf("client: transaction %s: nonce used, but its state is %s", nonce, st.Status)
}

// sameRequest checks that the committed transaction of res was r: a
// version it wrote (the first of its proofs; all record the same request)
// must hold r's nonce, contract, argument and signer, and hash to what its
// proof says. A transaction that wrote nothing passes.
func (c *Client) sameRequest(ctx context.Context, r *proof.Request, res *proof.Result) error {
	if len(res.Proofs) == 0 {
		return nil
	}
	p := &res.Proofs[0]
	vs, err := c.History(ctx, p.ID, proof.ScanRange{Start: p.Age, End: p.Age, Limit: 1})
	if err != nil {
		return fmt.Errorf("client: version %s@%d written under nonce %s: %w", p.ID, p.Age, r.Nonce, err)
	}
	if len(vs) != 1 || vs[0].Age != p.Age || !bytes.Equal(vs[0].ComputeHash(), p.Hash) {
		return fmt.Errorf("client: version %s@%d written under nonce %s: the ledger returned %d versions, none matching its proof", p.ID, p.Age, r.Nonce, len(vs))
	}
	v := vs[0]
	var differ []string
	for _, d := range []struct {
		field string
		same  bool
	}{{"nonce", v.Nonce == r.Nonce}, {"contract", v.Contract == r.ContractID}, {"argument", bytes.Equal(v.Argument, r.Argument)},
		{"entity", v.Entity == r.Entity}, {"key version", v.KeyVersion == r.KeyVersion}} {
		if !d.same {
			differ = append(differ, d.field)
		}
	}
	if len(differ) > 0 {
		return nonceUsed(r.Nonce, fmt.Sprintf("another request (it differs in %s, as %s@%d records)", strings.Join(differ, ", "), v.ID, v.Age))
	}
	return nil
}

// nonceUsed is ErrNonceReused for a nonce whose recorded outcome belongs
// to another request, described by other.
func nonceUsed(nonce, other string) error {
	return &Error{Code: wire.Code("nonce_reused"), Kind: "nonce_reused", sentinel: proof.ErrNonceReused,
		Msg: fmt.Sprintf("nonce %s was used by %s", nonce, other)}
}

// CommittedResult rebuilds the result of a committed transaction from its
// recorded state: the receipt it holds and the proof of each version it
// wrote, fetched from the ledger.
func (c *Client) CommittedResult(ctx context.Context, st *proof.TxState) (*proof.Result, error) {
	res := &proof.Result{Receipt: st.Receipt()}
	for _, id := range slices.Sorted(maps.Keys(st.Writes)) {
		p, err := c.Proof(ctx, id, st.Writes[id])
		if err != nil {
			return nil, fmt.Errorf("client: proof of %s@%d for %s: %w", id, st.Writes[id], st.Nonce, err)
		}
		res.Proofs = append(res.Proofs, *p)
	}
	return res, nil
}

// TxState returns the ledger's recorded state of nonce.
func (c *Client) TxState(ctx context.Context, nonce string) (*proof.TxState, error) {
	req := &api.GetTxStateRequest{Nonce: nonce}
	st, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.TxState, error) {
		return viaMux(ctx, t, &api.CallRequest{Call: &api.CallRequest_GetTxState{GetTxState: req}}, (*api.CallReply).GetTxState,
			func(ctx context.Context, o ...grpc.CallOption) (*api.TxState, error) {
				return t.api.GetTxState(ctx, req, o...)
			}, o)
	})
	if err != nil {
		return nil, err
	}
	return wire.TxStateFromAPI(st)
}

// History returns the versions of asset id in r: at most r.Limit, or the
// server's cap when r.Limit is 0. The server keeps each reply within a
// byte budget and says when the budget cut one short; History then asks
// again from after the last version it got, until it has the limit or
// the range's end. An asset with no version at all is proof.ErrNotFound
// (NOT_FOUND, as for Proof); a range of an existing asset that holds no
// version is an empty list.
func (c *Client) History(ctx context.Context, id string, r proof.ScanRange) ([]*proof.Version, error) {
	var out []*proof.Version
	limit := r.Limit
	for {
		req := &api.GetAssetRequest{Id: id, StartAge: r.Start, EndAge: r.End, Descending: !r.Ascending, Limit: int32(limit)}
		reply, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.GetAssetReply, error) {
			return t.api.GetAsset(ctx, req, o...)
		})
		if err != nil {
			return nil, err
		}
		for _, v := range reply.Versions {
			lv, err := wire.VersionFromAPI(v)
			if err != nil {
				return nil, err
			}
			out = append(out, lv)
		}
		n := len(reply.Versions)
		if !reply.Truncated || n == 0 || int(reply.Limit) <= n {
			return out, nil
		}
		// The rest of the range, after the last version received; a page
		// out of order ends the walk rather than loop.
		last := out[len(out)-1].Age
		switch {
		case r.Ascending && last >= r.Start:
			r.Start = last + 1
		case !r.Ascending && last >= r.Start && (r.End < 0 || last <= r.End) && last > 0:
			r.End = last - 1
		default:
			return out, nil
		}
		limit = int(reply.Limit) - n
	}
}

// Proof fetches the proof of version age of asset id.
func (c *Client) Proof(ctx context.Context, id string, age int64) (*proof.Proof, error) {
	p, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.Proof, error) {
		return t.api.GetProof(ctx, &api.GetProofRequest{Id: id, Age: age}, o...)
	})
	if err != nil {
		return nil, err
	}
	return wire.ProofFromAPI(p)
}

// ValidateLedger asks the ledger to validate versions [start, end] of id
// (end < 0: up to the latest). The server checks a bounded number of
// versions per call; ValidateLedger calls again from where each call
// stopped and returns the whole range's outcome.
func (c *Client) ValidateLedger(ctx context.Context, id string, start, end int64) (*api.ValidateLedgerReply, error) {
	var total *api.ValidateLedgerReply
	for {
		v, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.ValidateLedgerReply, error) {
			return t.api.ValidateLedger(ctx, &api.ValidateLedgerRequest{Id: id, StartAge: start, EndAge: end}, o...)
		})
		if err != nil {
			return nil, err
		}
		if total == nil {
			total = v
		} else {
			checked := total.Checked + v.Checked
			v.StartAge, v.Checked = total.StartAge, checked
			total = v
		}
		if !v.Truncated || !v.Ok {
			return total, nil
		}
		if v.EndAge < start {
			return nil, fmt.Errorf("client: validate-ledger of %s stopped at age %d before starting at %d", id, v.EndAge, start)
		}
		start = v.EndAge + 1
	}
}

// LedgerKey returns the ledger's proof key description.
func (c *Client) LedgerKey(ctx context.Context) (*api.LedgerKey, error) {
	k, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.LedgerKey, error) {
		return t.api.GetLedgerKey(ctx, &api.GetLedgerKeyRequest{}, o...)
	})
	return k, err
}

// AbortNonce sends an Auditor's signed abort of a nonce to the ledger and
// returns the nonce's state: aborted, or the state it had already. Only
// the Auditor the ledger runs with can (otherwise proof.ErrNotAuditor).
func (c *Client) AbortNonce(ctx context.Context, r *proof.AbortRequest) (*proof.TxState, error) {
	st, _, err := call(ctx, c, func(ctx context.Context, t *target, o ...grpc.CallOption) (*api.TxState, error) {
		return t.api.AbortNonce(ctx, wire.AbortToAPI(r), o...)
	})
	if err != nil {
		return nil, err
	}
	return wire.TxStateFromAPI(st)
}
