package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wire"
)

// service implements api.LedgerServer over a ledger.
type service struct {
	api.UnimplementedLedgerServer
	// l is the ledger of a single server; a cluster member's is its
	// member's, while it leads (ledger).
	l          *ledger.Ledger
	member     *member
	maxRequest int // 0, or the bound lenientRequest enforces
	adminToken string
	key        *api.LedgerKey
	// observe wraps each call that arrives over the CallBatches stream as it
	// wraps a unary call (metrics, logging): the server's interceptor.
	observe grpc.UnaryServerInterceptor
	// closing ends the CallBatches streams once their received calls are
	// answered (graceful shutdown: GracefulStop waits for streams).
	closing chan struct{}
}

// register registers svc on s as the Ledger service (RegisterService).
func register(s grpc.ServiceRegistrar, svc *service) {
	RegisterService(s, &api.Ledger_ServiceDesc, svc, svc.maxRequest)
}

// RegisterService registers impl on s as the service desc describes, as
// s.RegisterService does, except that each unary method receives its
// request through a lenientRequest, so that a request that does not
// decode is INVALID_ARGUMENT, and one over maxRequest bytes (if not 0)
// RESOURCE_EXHAUSTED. The ledger's CallBatches stream receives its
// messages the same way (dispatcher.receive).
func RegisterService(s grpc.ServiceRegistrar, desc *grpc.ServiceDesc, impl any, maxRequest int) {
	d := *desc // a copy: the generated one stays as it is
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		h := d.Methods[i].Handler
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(m any) error { return receiveRequest(dec, m.(proto.Message), maxRequest) }, ic)
		}
	}
	s.RegisterService(&d, impl)
}

// receiveRequest receives a request message into m with recv (a stream's
// RecvMsg, or a unary handler's decoding function): a message that does
// not decode is INVALID_ARGUMENT (see lenientRequest), and one over limit
// bytes (when limit > 0) RESOURCE_EXHAUSTED.
func receiveRequest(recv func(any) error, m proto.Message, limit int) error {
	r := lenientRequest{m: m, limit: limit}
	if err := recv(&r); err != nil {
		return err
	}
	return r.err
}

// lenientRequest receives a request message, decoding it into m, and
// keeps a decoding failure as the client's fault, INVALID_ARGUMENT.
// Received into m directly, a message that does not decode (a string field
// that is not UTF-8, which proto3 forbids, or a message cut short) ends the
// call at once with INTERNAL, a fault of the server's: grpc's codec fails,
// and its serverStream.RecvMsg writes that status itself, before any
// handler or interceptor can answer otherwise. grpc's codec hands a
// lenientRequest's bytes to its Unmarshal, the method protobuf's Go API
// calls for message types of its older API that decode themselves, which
// decodes them into m and reports success to grpc.
type lenientRequest struct {
	m   proto.Message
	err error // why the message did not decode; nil if it did
	// limit, if not 0, bounds the message's bytes: a cluster member's
	// gRPC server takes its peers' larger messages, and holds its
	// clients' to Transport.MaxRequestBytes here.
	limit int
}

func (*lenientRequest) Reset()         {}
func (*lenientRequest) String() string { return "request" }
func (*lenientRequest) ProtoMessage()  {}

// Unmarshal decodes b into r.m, which keeps no reference to b (grpc reuses
// b's buffer).
func (r *lenientRequest) Unmarshal(b []byte) error {
	if r.limit > 0 && len(b) > r.limit {
		r.err = status.Errorf(codes.ResourceExhausted, "the request is %d bytes, more than the %d this server takes", len(b), r.limit)
		return nil
	}
	if err := proto.Unmarshal(b, r.m); err != nil {
		r.err = status.Errorf(codes.InvalidArgument, "the request does not decode: %v", err)
	}
	return nil
}

func (s *service) requireAdmin(ctx context.Context) error { return RequireAdmin(ctx, s.adminToken) }

// RequireAdmin checks that the call of ctx presents token as its bearer
// token ("authorization: Bearer <token>" metadata). With no token
// configured registration is disabled (ErrRegistrationDisabled); a wrong
// or missing one is PERMISSION_DENIED.
func RequireAdmin(ctx context.Context, token string) error {
	if token == "" {
		return fmt.Errorf("%w: start the server with an admin token to register identities", ledger.ErrRegistrationDisabled)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1 {
			return nil
		}
	}
	return status.Error(codes.PermissionDenied, "identity registration needs the administrator's bearer token")
}

func (s *service) RegisterCertificate(ctx context.Context, r *api.RegisterCertificateRequest) (*api.RegisterReply, error) {
	if err := s.requireAdmin(ctx); err != nil {
		return nil, s.status(ctx, err)
	}
	l, err := s.ledger()
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return &api.RegisterReply{}, s.status(ctx, l.RegisterCertificate(ctx, r.Entity, r.KeyVersion, []byte(r.CertificatePem)))
}

func (s *service) RegisterSecret(ctx context.Context, r *api.RegisterSecretRequest) (*api.RegisterReply, error) {
	if err := s.requireAdmin(ctx); err != nil {
		return nil, s.status(ctx, err)
	}
	l, err := s.ledger()
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return &api.RegisterReply{}, s.status(ctx, l.RegisterSecret(ctx, r.Entity, r.KeyVersion, r.Secret))
}

func (s *service) RegisterContract(ctx context.Context, r *api.RegisterContractRequest) (*api.RegisterReply, error) {
	l, err := s.ledger()
	if err != nil {
		return nil, s.status(ctx, err)
	}
	err = l.RegisterContract(ctx, &ledger.ContractRegistration{ID: r.ContractId, Source: r.Source,
		Entity: r.Entity, KeyVersion: r.KeyVersion, Signature: r.Signature})
	return &api.RegisterReply{}, s.status(ctx, err)
}

func (s *service) ListContracts(ctx context.Context, _ *api.ListContractsRequest) (*api.ListContractsReply, error) {
	l, err := s.readLedger(ctx)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	cs, err := l.ListContracts(ctx)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	out := &api.ListContractsReply{}
	for _, c := range cs {
		out.Contracts = append(out.Contracts, &api.ContractInfo{ContractId: c.ID, Entity: c.Entity, KeyVersion: c.KeyVersion,
			Source: c.Source, Builtin: c.Builtin})
	}
	return out, nil
}

func (s *service) ExecuteContract(ctx context.Context, r *api.ExecuteRequest) (*api.ExecuteReply, error) {
	l, err := s.ledger()
	if err != nil {
		return nil, s.status(ctx, err)
	}
	res, err := l.ExecuteOrdered(ctx, wire.RequestFromAPI(r), wire.OrderTokenFromAPI(r.OrderToken))
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return wire.ResultToAPI(res), nil
}

// AbortNonce has the ledger abort a nonce at its Auditor's signed word
// (ledger.AbortOrdered).
func (s *service) AbortNonce(ctx context.Context, r *api.AbortNonceRequest) (*api.TxState, error) {
	l, err := s.ledger()
	if err != nil {
		return nil, s.status(ctx, err)
	}
	st, err := l.AbortOrdered(ctx, wire.AbortFromAPI(r))
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return wire.TxStateToAPI(st), nil
}

func (s *service) GetAsset(ctx context.Context, r *api.GetAssetRequest) (*api.GetAssetReply, error) {
	l, err := s.readLedger(ctx)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	page, err := l.History(ctx, r.Id, ledger.ScanRange{Start: r.StartAge, End: r.EndAge, Ascending: !r.Descending, Limit: int(r.Limit)})
	if err != nil {
		return nil, s.status(ctx, err)
	}
	out := &api.GetAssetReply{Limit: int32(page.Limit), Truncated: page.Truncated}
	for _, v := range page.Versions {
		out.Versions = append(out.Versions, wire.VersionToAPI(v))
	}
	return out, nil
}

func (s *service) GetProof(ctx context.Context, r *api.GetProofRequest) (*api.Proof, error) {
	l, err := s.readLedger(ctx)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	p, err := l.Proof(ctx, r.Id, r.Age)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return wire.ProofToAPI(p), nil
}

func (s *service) GetTxState(ctx context.Context, r *api.GetTxStateRequest) (*api.TxState, error) {
	l, err := s.readLedger(ctx)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	st, err := l.TxState(ctx, r.Nonce)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return wire.TxStateToAPI(st), nil
}

func (s *service) ValidateLedger(ctx context.Context, r *api.ValidateLedgerRequest) (*api.ValidateLedgerReply, error) {
	l, err := s.readLedger(ctx)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	v, err := l.ValidateLedger(ctx, r.Id, r.StartAge, r.EndAge)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	out := &api.ValidateLedgerReply{Id: v.ID, StartAge: v.Start, EndAge: v.End, Checked: int64(v.Checked), Ok: v.Fault == nil,
		Truncated: v.Truncated}
	if f := v.Fault; f != nil {
		out.FaultAge, out.FaultCheck, out.FaultDetail = f.Age, f.Check, f.Detail
	}
	return out, nil
}

func (s *service) GetLedgerKey(context.Context, *api.GetLedgerKeyRequest) (*api.LedgerKey, error) {
	return s.key, nil
}

// ledger is the ledger calls go to: a cluster member's only while it
// leads (else a *NotLeaderError).
func (s *service) ledger() (*ledger.Ledger, error) {
	if s.member == nil {
		return s.l, nil
	}
	return s.member.ledger()
}

// readLedger is ledger for a read: a cluster member first confirms with
// its peers that it still leads (member.confirm), so that a read never
// misses a write another leader acknowledged.
func (s *service) readLedger(ctx context.Context) (*ledger.Ledger, error) {
	l, err := s.ledger()
	if err == nil && s.member != nil {
		err = s.member.confirm(ctx)
	}
	return l, err
}

// status is toStatus, with a member's leader hint on a refusal because it
// does not lead (its engine's storage.ErrNotLeader included).
func (s *service) status(ctx context.Context, err error) error {
	if s.member != nil && errors.Is(err, storage.ErrNotLeader) {
		var nl *NotLeaderError
		if !errors.As(err, &nl) {
			err = s.member.notLeader(err)
		}
	}
	return toStatus(ctx, err)
}

// Status is the gRPC status that stands for err, as the ledger's calls
// return it: the code of its kind, and the kind in the "kiroku-error"
// trailer of the call of ctx (which it sets). An error that is a status
// already is returned as it is.
func Status(ctx context.Context, err error) error { return toStatus(ctx, err) }

// toStatus maps an error to a gRPC status, and sets the error-kind trailer
// for the ledger's own errors.
func toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code, kind := errorCode(err)
	if kind != "" {
		md := metadata.Pairs(wire.ErrorKindKey, kind)
		var nl *NotLeaderError
		if errors.As(err, &nl) && nl.Address != "" {
			md.Append(wire.LeaderKey, nl.Address)
		}
		_ = grpc.SetTrailer(ctx, md)
	}
	return status.Error(code, err.Error())
}

// errorCode is the gRPC code and the ledger error kind ("" if none) that
// stand for err.
func errorCode(err error) (codes.Code, string) {
	kind := ledger.Kind(err)
	code := wire.Code(kind)
	if kind == "" {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			code = codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			code = codes.Canceled
		case errors.Is(err, storage.ErrCommitUnknown):
			code, kind = codes.Unknown, wire.KindCommitUnknown
		case errors.Is(err, storage.ErrNotLeader):
			code, kind = codes.Unavailable, wire.KindNotLeader
		case errors.Is(err, storage.ErrUnavailable), errors.Is(err, storage.ErrClosed):
			code = codes.Unavailable
		case errors.Is(err, storage.ErrRetriesExhausted), errors.Is(err, storage.ErrConflict):
			code, kind = codes.Aborted, wire.KindConflict
		}
	}
	return code, kind
}
