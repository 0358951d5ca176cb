// Package wire converts between the records of package proof (the
// ledger's requests, versions, proofs, receipts and transaction states,
// the Auditor's tokens, approvals and aborts) and the gRPC API's messages, and holds the error convention both ends
// share: the trailer that names a ledger error's kind, the gRPC code each
// kind travels with, and the trailers of a Byzantine fault. The server and the client SDK both use it, so
// the SDK does not depend on the server, the ledger or the storage
// backends behind them.
package wire

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/proof"
)

// ErrorKindKey is the trailer that carries the ledger's error kind.
const ErrorKindKey = "kiroku-error"

// KindCommitUnknown is the trailer's kind for a commit whose outcome the
// server could not learn (storage.ErrCommitUnknown); the transaction may
// have committed, so a client retries with the same nonce.
const KindCommitUnknown = "commit_unknown"

// KindConflict is the trailer's kind, with ABORTED, for a transaction that
// conflicted with others on every attempt the server made
// (storage.ErrRetriesExhausted, storage.ErrConflict): nothing was
// committed and no outcome recorded, so the same request (nonce) may be
// sent again.
const KindConflict = "conflict"

// KindNotLeader is the trailer's kind, with UNAVAILABLE, of a call to a
// member of a cluster that does not lead it (or stopped leading while the
// call ran: a commit in flight then is KindCommitUnknown). Nothing was
// done; LeaderKey names the leader's address if the member knows it.
const KindNotLeader = "not_leader"

// LeaderKey is the trailer that carries, with KindNotLeader, the address
// of the member that leads.
const LeaderKey = "kiroku-leader"

// Code is the gRPC code a ledger error of kind travels with: Internal for
// a kind it does not know, and for "" (not a ledger error), which the
// server refines from the error itself.
func Code(kind string) codes.Code {
	switch kind {
	case "bad_request", "bad_argument", "bad_contract", "bad_value", "too_large":
		return codes.InvalidArgument
	case "unknown_entity", "bad_signature":
		return codes.Unauthenticated
	case "nonce_reused", "contract_exists", "identity_exists":
		return codes.AlreadyExists
	case "unknown_contract", "not_found":
		return codes.NotFound
	case "contract_failed", "step_limit", "memory_limit", "time_limit", "call_depth":
		return codes.FailedPrecondition
	case "registration_disabled", "order_token", "not_auditor":
		return codes.PermissionDenied
	case "not_ordered":
		return codes.FailedPrecondition
	case "byzantine_fault":
		return codes.DataLoss
	case "overloaded":
		return codes.Unavailable
	}
	return codes.Internal
}

// The trailers of a Byzantine fault (kind byzantine_fault, code
// DATA_LOSS), beside ErrorKindKey: the asset (absent for a check on the
// whole transaction), its age and the check that failed. The status
// message is the fault's detail; the nonce is the request's.
const (
	FaultAssetKey = "kiroku-fault-asset"
	FaultAgeKey   = "kiroku-fault-age"
	FaultCheckKey = "kiroku-fault-check"
)

// FaultTrailer returns the trailers of f besides its kind. An asset id or
// check that is not printable ASCII (which a header value must be, and
// which the ledger's ids are) is left out.
func FaultTrailer(f *proof.ByzantineFault) metadata.MD {
	md := metadata.Pairs(FaultAgeKey, strconv.FormatInt(f.Age, 10))
	if f.Asset != "" && printable(f.Asset) {
		md.Set(FaultAssetKey, f.Asset)
	}
	if printable(f.Check) {
		md.Set(FaultCheckKey, f.Check)
	}
	return md
}

// FaultFromTrailer rebuilds the fault of the request nonce from a
// status's message and its trailers.
func FaultFromTrailer(nonce, msg string, md metadata.MD) *proof.ByzantineFault {
	f := &proof.ByzantineFault{Nonce: nonce, Detail: msg}
	if v := md.Get(FaultAssetKey); len(v) > 0 {
		f.Asset = v[0]
	}
	if v := md.Get(FaultCheckKey); len(v) > 0 {
		f.Check = v[0]
	}
	if v := md.Get(FaultAgeKey); len(v) > 0 {
		f.Age, _ = strconv.ParseInt(v[0], 10, 64)
	}
	return f
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// RequestFromAPI converts a wire request; its order token, if any, is
// OrderTokenFromAPI's.
func RequestFromAPI(r *api.ExecuteRequest) *proof.Request {
	return &proof.Request{Nonce: r.Nonce, ContractID: r.ContractId, Argument: r.Argument, Entity: r.Entity,
		KeyVersion: r.KeyVersion, Signature: r.Signature}
}

// RequestToAPI converts a request for the wire.
func RequestToAPI(r *proof.Request) *api.ExecuteRequest {
	return &api.ExecuteRequest{Nonce: r.Nonce, ContractId: r.ContractID, Argument: r.Argument, Entity: r.Entity,
		KeyVersion: r.KeyVersion, Signature: r.Signature}
}

// OrderTokenFromAPI converts a wire order token; nil for none.
func OrderTokenFromAPI(t *api.OrderToken) *proof.OrderToken {
	if t == nil {
		return nil
	}
	return &proof.OrderToken{Nonce: t.Nonce, Digest: t.Digest, Deadline: t.DeadlineMillis, Signature: t.Signature}
}

// OrderTokenToAPI converts an order token for the wire; nil for none.
func OrderTokenToAPI(t *proof.OrderToken) *api.OrderToken {
	if t == nil {
		return nil
	}
	return &api.OrderToken{Nonce: t.Nonce, Digest: t.Digest, DeadlineMillis: t.Deadline, Signature: t.Signature}
}

// ApprovalFromAPI converts a wire approval.
func ApprovalFromAPI(a *api.Approval) *proof.Approval {
	return &proof.Approval{Nonce: a.Nonce, Digest: a.Digest, Signature: a.Signature}
}

// ApprovalToAPI converts an approval for the wire.
func ApprovalToAPI(a *proof.Approval) *api.Approval {
	return &api.Approval{Nonce: a.Nonce, Digest: a.Digest, Signature: a.Signature}
}

// AbortFromAPI converts a wire abort.
func AbortFromAPI(r *api.AbortNonceRequest) *proof.AbortRequest {
	return &proof.AbortRequest{Nonce: r.Nonce, Reason: r.Reason, Deadline: r.DeadlineMillis, Signature: r.Signature}
}

// AbortToAPI converts an abort for the wire.
func AbortToAPI(r *proof.AbortRequest) *api.AbortNonceRequest {
	return &api.AbortNonceRequest{Nonce: r.Nonce, Reason: r.Reason, DeadlineMillis: r.Deadline, Signature: r.Signature}
}

func inputToAPI(m map[string]int64) []*api.InputEntry {
	out := make([]*api.InputEntry, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, &api.InputEntry{Id: k, Age: m[k]})
	}
	return out
}

// inputFromAPI converts a wire input set; a repeated id is an error.
func inputFromAPI(in []*api.InputEntry) (map[string]int64, error) {
	m := make(map[string]int64, len(in))
	for _, e := range in {
		if _, dup := m[e.Id]; dup {
			return nil, fmt.Errorf("%w: input names %s twice", proof.ErrBadRequest, e.Id)
		}
		m[e.Id] = e.Age
	}
	return m, nil
}

// ProofToAPI converts a proof for the wire.
func ProofToAPI(p *proof.Proof) *api.Proof {
	return &api.Proof{Id: p.ID, Age: p.Age, Nonce: p.Nonce, Input: inputToAPI(p.Input), Hash: p.Hash,
		PrevHash: p.PrevHash, Signature: p.Signature}
}

// ProofFromAPI converts a wire proof.
func ProofFromAPI(p *api.Proof) (*proof.Proof, error) {
	in, err := inputFromAPI(p.Input)
	if err != nil {
		return nil, err
	}
	return &proof.Proof{ID: p.Id, Age: p.Age, Nonce: p.Nonce, Input: in, Hash: p.Hash, PrevHash: p.PrevHash, Signature: p.Signature}, nil
}

// VersionToAPI converts a version for the wire.
func VersionToAPI(v *proof.Version) *api.AssetVersion {
	return &api.AssetVersion{Id: v.ID, Age: v.Age, Input: inputToAPI(v.Input), Output: v.Output, ContractId: v.Contract,
		Argument: v.Argument, Nonce: v.Nonce, Entity: v.Entity, KeyVersion: v.KeyVersion, Signature: v.Signature,
		PrevHash: v.PrevHash, Hash: v.Hash, ProofSignature: v.ProofSignature}
}

// VersionFromAPI converts a wire version.
func VersionFromAPI(v *api.AssetVersion) (*proof.Version, error) {
	in, err := inputFromAPI(v.Input)
	if err != nil {
		return nil, err
	}
	return &proof.Version{ID: v.Id, Age: v.Age, Input: in, Output: v.Output, Contract: v.ContractId, Argument: v.Argument,
		Nonce: v.Nonce, Entity: v.Entity, KeyVersion: v.KeyVersion, Signature: v.Signature, PrevHash: v.PrevHash,
		Hash: v.Hash, ProofSignature: v.ProofSignature}, nil
}

// ResultToAPI converts an execution's result for the wire.
func ResultToAPI(res *proof.Result) *api.ExecuteReply {
	out := &api.ExecuteReply{Nonce: res.Nonce, Result: res.Result, ContractId: res.Contract, Input: inputToAPI(res.Input),
		Signature: res.Signature}
	for i := range res.Proofs {
		out.Proofs = append(out.Proofs, ProofToAPI(&res.Proofs[i]))
	}
	return out
}

// ResultFromAPI converts a wire result. The receipt's write set is the one
// the proofs state.
func ResultFromAPI(r *api.ExecuteReply) (*proof.Result, error) {
	in, err := inputFromAPI(r.Input)
	if err != nil {
		return nil, err
	}
	res := &proof.Result{Receipt: proof.Receipt{Nonce: r.Nonce, Contract: r.ContractId, Input: in, Result: r.Result,
		Writes: make(map[string]int64, len(r.Proofs)), Signature: r.Signature}}
	for _, p := range r.Proofs {
		lp, err := ProofFromAPI(p)
		if err != nil {
			return nil, err
		}
		if _, dup := res.Writes[lp.ID]; dup {
			return nil, fmt.Errorf("%w: two proofs for asset %s", proof.ErrBadRequest, lp.ID)
		}
		res.Writes[lp.ID] = lp.Age
		res.Proofs = append(res.Proofs, *lp)
	}
	return res, nil
}

// TxStateToAPI converts a transaction state for the wire.
func TxStateToAPI(st *proof.TxState) *api.TxState {
	out := &api.TxState{Nonce: st.Nonce, Status: string(st.Status), Kind: st.Kind, Reason: st.Reason,
		ContractId: st.Contract, Result: st.Result, Signature: st.Signature}
	if st.Writes != nil {
		out.Writes = inputToAPI(st.Writes)
	}
	if st.Input != nil {
		out.Input = inputToAPI(st.Input)
	}
	return out
}

// TxStateFromAPI converts a wire transaction state.
func TxStateFromAPI(t *api.TxState) (*proof.TxState, error) {
	st := &proof.TxState{Nonce: t.Nonce, Status: proof.TxStatus(t.Status), Kind: t.Kind, Reason: t.Reason,
		Contract: t.ContractId, Result: t.Result, Signature: t.Signature}
	var err error
	if st.Writes, err = inputFromAPI(t.Writes); err != nil {
		return nil, err
	}
	if st.Input, err = inputFromAPI(t.Input); err != nil {
		return nil, err
	}
	return st, nil
}
