package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/storage"
)

// ErrorKindKey is the trailer that carries the ledger's error kind.
const ErrorKindKey = "kiroku-error"

// KindCommitUnknown is the trailer's kind for a commit whose outcome the
// server could not learn (storage.ErrCommitUnknown); the transaction may
// have committed, so a client retries with the same nonce.
const KindCommitUnknown = "commit_unknown"

// service implements api.LedgerServer over a ledger.
type service struct {
	api.UnimplementedLedgerServer
	l          *ledger.Ledger
	adminToken string
	key        *api.LedgerKey
}

func (s *service) requireAdmin(ctx context.Context) error {
	if s.adminToken == "" {
		return fmt.Errorf("%w: start the server with an admin token to register identities", ledger.ErrRegistrationDisabled)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(s.adminToken)) == 1 {
			return nil
		}
	}
	return status.Error(codes.PermissionDenied, "identity registration needs the administrator's bearer token")
}

func (s *service) RegisterCertificate(ctx context.Context, r *api.RegisterCertificateRequest) (*api.RegisterReply, error) {
	if err := s.requireAdmin(ctx); err != nil {
		return nil, toStatus(ctx, err)
	}
	return &api.RegisterReply{}, toStatus(ctx, s.l.RegisterCertificate(ctx, r.Entity, r.KeyVersion, []byte(r.CertificatePem)))
}

func (s *service) RegisterSecret(ctx context.Context, r *api.RegisterSecretRequest) (*api.RegisterReply, error) {
	if err := s.requireAdmin(ctx); err != nil {
		return nil, toStatus(ctx, err)
	}
	return &api.RegisterReply{}, toStatus(ctx, s.l.RegisterSecret(ctx, r.Entity, r.KeyVersion, r.Secret))
}

func (s *service) RegisterContract(ctx context.Context, r *api.RegisterContractRequest) (*api.RegisterReply, error) {
	err := s.l.RegisterContract(ctx, &ledger.ContractRegistration{ID: r.ContractId, Source: r.Source,
		Entity: r.Entity, KeyVersion: r.KeyVersion, Signature: r.Signature})
	return &api.RegisterReply{}, toStatus(ctx, err)
}

func (s *service) ListContracts(ctx context.Context, _ *api.ListContractsRequest) (*api.ListContractsReply, error) {
	cs, err := s.l.ListContracts(ctx)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &api.ListContractsReply{}
	for _, c := range cs {
		out.Contracts = append(out.Contracts, &api.ContractInfo{ContractId: c.ID, Entity: c.Entity, KeyVersion: c.KeyVersion,
			Source: c.Source, Builtin: c.Builtin})
	}
	return out, nil
}

func (s *service) ExecuteContract(ctx context.Context, r *api.ExecuteRequest) (*api.ExecuteReply, error) {
	res, err := s.l.Execute(ctx, RequestFromAPI(r))
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return ResultToAPI(res), nil
}

func (s *service) GetAsset(ctx context.Context, r *api.GetAssetRequest) (*api.GetAssetReply, error) {
	vs, err := s.l.History(ctx, r.Id, ledger.ScanRange{Start: r.StartAge, End: r.EndAge, Ascending: !r.Descending, Limit: int(r.Limit)})
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &api.GetAssetReply{}
	for _, v := range vs {
		out.Versions = append(out.Versions, VersionToAPI(v))
	}
	return out, nil
}

func (s *service) GetProof(ctx context.Context, r *api.GetProofRequest) (*api.Proof, error) {
	p, err := s.l.Proof(ctx, r.Id, r.Age)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return ProofToAPI(p), nil
}

func (s *service) GetTxState(ctx context.Context, r *api.GetTxStateRequest) (*api.TxState, error) {
	st, err := s.l.TxState(ctx, r.Nonce)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return TxStateToAPI(st), nil
}

func (s *service) ValidateLedger(ctx context.Context, r *api.ValidateLedgerRequest) (*api.ValidateLedgerReply, error) {
	v, err := s.l.ValidateLedger(ctx, r.Id, r.StartAge, r.EndAge)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &api.ValidateLedgerReply{Id: v.ID, StartAge: v.Start, EndAge: v.End, Checked: int64(v.Checked), Ok: v.Fault == nil}
	if f := v.Fault; f != nil {
		out.FaultAge, out.FaultCheck, out.FaultDetail = f.Age, f.Check, f.Detail
	}
	return out, nil
}

func (s *service) GetLedgerKey(context.Context, *api.GetLedgerKeyRequest) (*api.LedgerKey, error) {
	return s.key, nil
}

// toStatus maps an error to a gRPC status, and sets the error-kind trailer
// for the ledger's own errors.
func toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	kind := ledger.Kind(err)
	switch kind {
	case "bad_request", "bad_argument", "bad_contract", "bad_value", "too_large":
		code = codes.InvalidArgument
	case "unknown_entity", "bad_signature":
		code = codes.Unauthenticated
	case "nonce_reused", "contract_exists", "identity_exists":
		code = codes.AlreadyExists
	case "unknown_contract", "not_found":
		code = codes.NotFound
	case "contract_failed", "step_limit", "call_depth":
		code = codes.FailedPrecondition
	case "registration_disabled":
		code = codes.PermissionDenied
	case "":
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			code = codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			code = codes.Canceled
		case errors.Is(err, storage.ErrCommitUnknown):
			code, kind = codes.Unknown, KindCommitUnknown
		case errors.Is(err, storage.ErrUnavailable), errors.Is(err, storage.ErrClosed):
			code = codes.Unavailable
		case errors.Is(err, storage.ErrRetriesExhausted), errors.Is(err, storage.ErrConflict):
			code = codes.Aborted
		}
	}
	if kind != "" {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(ErrorKindKey, kind))
	}
	return status.Error(code, err.Error())
}

// RequestFromAPI converts a wire request.
func RequestFromAPI(r *api.ExecuteRequest) *ledger.Request {
	return &ledger.Request{Nonce: r.Nonce, ContractID: r.ContractId, Argument: r.Argument, Entity: r.Entity,
		KeyVersion: r.KeyVersion, Signature: r.Signature}
}

// RequestToAPI converts a request for the wire.
func RequestToAPI(r *ledger.Request) *api.ExecuteRequest {
	return &api.ExecuteRequest{Nonce: r.Nonce, ContractId: r.ContractID, Argument: r.Argument, Entity: r.Entity,
		KeyVersion: r.KeyVersion, Signature: r.Signature}
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
			return nil, fmt.Errorf("%w: input names %s twice", ledger.ErrBadRequest, e.Id)
		}
		m[e.Id] = e.Age
	}
	return m, nil
}

// ProofToAPI converts a proof for the wire.
func ProofToAPI(p *ledger.Proof) *api.Proof {
	return &api.Proof{Id: p.ID, Age: p.Age, Nonce: p.Nonce, Input: inputToAPI(p.Input), Hash: p.Hash,
		PrevHash: p.PrevHash, Signature: p.Signature}
}

// ProofFromAPI converts a wire proof.
func ProofFromAPI(p *api.Proof) (*ledger.Proof, error) {
	in, err := inputFromAPI(p.Input)
	if err != nil {
		return nil, err
	}
	return &ledger.Proof{ID: p.Id, Age: p.Age, Nonce: p.Nonce, Input: in, Hash: p.Hash, PrevHash: p.PrevHash, Signature: p.Signature}, nil
}

// VersionToAPI converts a version for the wire.
func VersionToAPI(v *ledger.Version) *api.AssetVersion {
	return &api.AssetVersion{Id: v.ID, Age: v.Age, Input: inputToAPI(v.Input), Output: v.Output, ContractId: v.Contract,
		Argument: v.Argument, Nonce: v.Nonce, Entity: v.Entity, KeyVersion: v.KeyVersion, Signature: v.Signature,
		PrevHash: v.PrevHash, Hash: v.Hash, ProofSignature: v.ProofSignature}
}

// VersionFromAPI converts a wire version.
func VersionFromAPI(v *api.AssetVersion) (*ledger.Version, error) {
	in, err := inputFromAPI(v.Input)
	if err != nil {
		return nil, err
	}
	return &ledger.Version{ID: v.Id, Age: v.Age, Input: in, Output: v.Output, Contract: v.ContractId, Argument: v.Argument,
		Nonce: v.Nonce, Entity: v.Entity, KeyVersion: v.KeyVersion, Signature: v.Signature, PrevHash: v.PrevHash,
		Hash: v.Hash, ProofSignature: v.ProofSignature}, nil
}

// ResultToAPI converts an execution's result for the wire.
func ResultToAPI(res *ledger.Result) *api.ExecuteReply {
	out := &api.ExecuteReply{Nonce: res.Nonce, Result: res.Result, ContractId: res.Contract, Input: inputToAPI(res.Input),
		Signature: res.Signature}
	for i := range res.Proofs {
		out.Proofs = append(out.Proofs, ProofToAPI(&res.Proofs[i]))
	}
	return out
}

// ResultFromAPI converts a wire result. The receipt's write set is the one
// the proofs state.
func ResultFromAPI(r *api.ExecuteReply) (*ledger.Result, error) {
	in, err := inputFromAPI(r.Input)
	if err != nil {
		return nil, err
	}
	res := &ledger.Result{Receipt: ledger.Receipt{Nonce: r.Nonce, Contract: r.ContractId, Input: in, Result: r.Result,
		Writes: make(map[string]int64, len(r.Proofs)), Signature: r.Signature}}
	for _, p := range r.Proofs {
		lp, err := ProofFromAPI(p)
		if err != nil {
			return nil, err
		}
		if _, dup := res.Writes[lp.ID]; dup {
			return nil, fmt.Errorf("%w: two proofs for asset %s", ledger.ErrBadRequest, lp.ID)
		}
		res.Writes[lp.ID] = lp.Age
		res.Proofs = append(res.Proofs, *lp)
	}
	return res, nil
}

// TxStateToAPI converts a transaction state for the wire.
func TxStateToAPI(st *ledger.TxState) *api.TxState {
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
func TxStateFromAPI(t *api.TxState) (*ledger.TxState, error) {
	st := &ledger.TxState{Nonce: t.Nonce, Status: ledger.TxStatus(t.Status), Kind: t.Kind, Reason: t.Reason,
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
