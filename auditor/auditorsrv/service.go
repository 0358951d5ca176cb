package auditorsrv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auditor"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/wire"
)

// service implements api.AuditorServer over an Auditor and its replica.
type service struct {
	api.UnimplementedAuditorServer
	a          *auditor.Auditor
	replica    *ledger.Ledger
	adminToken string
	key        *api.AuditorKey
	metrics    *metrics
	log        *slog.Logger
}

func (s *service) RegisterCertificate(ctx context.Context, r *api.RegisterCertificateRequest) (*api.RegisterReply, error) {
	if err := server.RequireAdmin(ctx, s.adminToken); err != nil {
		return nil, s.status(ctx, err)
	}
	return &api.RegisterReply{}, s.status(ctx, s.replica.RegisterCertificate(ctx, r.Entity, r.KeyVersion, []byte(r.CertificatePem)))
}

func (s *service) RegisterSecret(ctx context.Context, r *api.RegisterSecretRequest) (*api.RegisterReply, error) {
	if err := server.RequireAdmin(ctx, s.adminToken); err != nil {
		return nil, s.status(ctx, err)
	}
	return &api.RegisterReply{}, s.status(ctx, s.replica.RegisterSecret(ctx, r.Entity, r.KeyVersion, r.Secret))
}

func (s *service) RegisterContract(ctx context.Context, r *api.RegisterContractRequest) (*api.RegisterReply, error) {
	err := s.replica.RegisterContract(ctx, &ledger.ContractRegistration{ID: r.ContractId, Source: r.Source,
		Entity: r.Entity, KeyVersion: r.KeyVersion, Signature: r.Signature})
	return &api.RegisterReply{}, s.status(ctx, err)
}

func (s *service) Order(ctx context.Context, r *api.ExecuteRequest) (*api.OrderToken, error) {
	tok, err := s.a.Order(ctx, wire.RequestFromAPI(r))
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return wire.OrderTokenToAPI(tok), nil
}

func (s *service) Validate(ctx context.Context, r *api.ValidateRequest) (*api.Approval, error) {
	if r.Request == nil || r.Reply == nil {
		return nil, s.status(ctx, fmt.Errorf("%w: a validation needs the request and the ledger's reply", ledger.ErrBadRequest))
	}
	res, err := wire.ResultFromAPI(r.Reply)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	ap, err := s.a.Validate(ctx, wire.RequestFromAPI(r.Request), res)
	if err != nil {
		return nil, s.status(ctx, err)
	}
	return wire.ApprovalToAPI(ap), nil
}

func (s *service) GetAuditorKey(context.Context, *api.GetAuditorKeyRequest) (*api.AuditorKey, error) {
	return s.key, nil
}

// status is server.Status, except for a Byzantine fault: DATA_LOSS, kind
// byzantine_fault, its asset, age and check in the kiroku-fault-*
// trailers and its detail as the message. A fault is logged at error
// level and counted: it is what the Auditor is for.
func (s *service) status(ctx context.Context, err error) error {
	var f *proof.ByzantineFault
	if !errors.As(err, &f) {
		return server.Status(ctx, err)
	}
	s.metrics.faults.WithLabelValues(f.Check).Inc()
	s.log.Error("Byzantine fault of the ledger", "phase", "validation", "nonce", f.Nonce, "asset", f.Asset, "age", f.Age,
		"check", f.Check, "detail", f.Detail)
	md := wire.FaultTrailer(f)
	md.Set(wire.ErrorKindKey, proof.Kind(err))
	_ = grpc.SetTrailer(ctx, md)
	return status.Error(codes.DataLoss, messageText(f.Detail))
}

// maxFaultMessage bounds a fault's detail on the wire, in bytes: it
// quotes what the ledger returned, which may be large (the log has it
// whole).
const maxFaultMessage = 4 << 10

// messageText is s as a status message: valid UTF-8, at most
// maxFaultMessage bytes.
func messageText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > maxFaultMessage {
		n := maxFaultMessage
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "…"
	}
	return s
}
