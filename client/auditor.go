package client

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/wire"
)

// The modes of a client (Config.Mode).
const (
	// ModeDirect sends every call to the ledger alone.
	ModeDirect = "direct"
	// ModeAuditor takes every execution through an Auditor (package
	// auditor): Order, the ledger's execution with the Auditor's token,
	// Validate. A result is returned only with the Auditor's approval of
	// its receipt, verified with the pinned key.
	ModeAuditor = "auditor"
	// ModeValidator sends every call to the ledger, as direct mode does,
	// for a Validator (package validator) that wraps the client and logs
	// each request in its database (Config.Validator) before it is sent.
	// The SDK alone cannot log: an application uses validator.Open on the
	// client, and the CLI does so itself.
	ModeValidator = "validator"
)

// ErrAuditorKey is the cause of an Auditor whose key is not the one the
// client pinned (Config.AuditorKey): nothing it signs is trusted.
var ErrAuditorKey = errors.New("client: the Auditor's key is not the pinned one")

// auditorConn is the Auditor of a client in Auditor mode.
type auditorConn struct {
	addr string
	conn *grpc.ClientConn
	api  api.AuditorClient
	pin  string // a fingerprint, until the key is fetched

	mu  sync.Mutex
	key auth.Verifier // nil until known
}

// dialAuditor sets up Auditor mode, if cfg asks for it.
func (c *Client) dialAuditor(cfg Config) error {
	switch cfg.Mode {
	case "", ModeDirect:
		return nil
	case ModeValidator:
		if cfg.Validator == "" {
			return errors.New("client: Validator mode needs the Validator's database (Config.Validator)")
		}
		return nil
	case ModeAuditor:
	default:
		return fmt.Errorf("client: unknown mode %q (direct, validator or auditor)", cfg.Mode)
	}
	if cfg.Auditor == "" || cfg.AuditorKey == "" {
		return errors.New("client: Auditor mode needs the Auditor's address and its key (PEM or fingerprint)")
	}
	a := &auditorConn{addr: cfg.Auditor}
	if strings.Contains(cfg.AuditorKey, "-----BEGIN ") {
		v, err := auditorVerifier([]byte(cfg.AuditorKey))
		if err != nil {
			return err
		}
		a.key = v
	} else {
		a.pin = strings.ToLower(strings.TrimSpace(cfg.AuditorKey))
		if b, err := hex.DecodeString(a.pin); err != nil || len(b) != 32 {
			return fmt.Errorf("client: the Auditor's key %q is neither a PEM public key nor a fingerprint (64 hex digits)", cfg.AuditorKey)
		}
	}
	conn, err := grpc.NewClient(cfg.Auditor, c.opts...)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	a.conn, a.api = conn, api.NewAuditorClient(conn)
	c.aud = a
	return nil
}

func auditorVerifier(pemBytes []byte) (auth.Verifier, error) {
	pub, err := auth.ParsePublicKeyPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("client: the Auditor's key: %w", err)
	}
	v, err := auth.NewECDSAVerifier(pub)
	if err != nil {
		return nil, fmt.Errorf("client: the Auditor's key: %w", err)
	}
	return v, nil
}

// auditorKey returns the Auditor's verifier: the pinned PEM's, or the key
// the Auditor serves once its fingerprint (computed here) is the pin.
func (c *Client) auditorKey(ctx context.Context) (auth.Verifier, error) {
	a := c.aud
	a.mu.Lock()
	v := a.key
	a.mu.Unlock()
	if v != nil {
		return v, nil
	}
	k, err := auditorCall(ctx, c, func(ctx context.Context, o ...grpc.CallOption) (*api.AuditorKey, error) {
		return a.api.GetAuditorKey(ctx, &api.GetAuditorKeyRequest{}, o...)
	})
	if err != nil {
		return nil, fmt.Errorf("client: asking the Auditor for its key: %w", err)
	}
	pub, err := auth.ParsePublicKeyPEM([]byte(k.PublicKeyPem))
	if err != nil {
		return nil, fmt.Errorf("%w: it serves no ECDSA public key: %v", ErrAuditorKey, err)
	}
	if got := auth.Fingerprint(pub); got != a.pin {
		return nil, fmt.Errorf("%w: it serves %s, the client pinned %s", ErrAuditorKey, got, a.pin)
	}
	if v, err = auth.NewECDSAVerifier(pub); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAuditorKey, err)
	}
	a.mu.Lock()
	a.key = v
	a.mu.Unlock()
	return v, nil
}

// auditorCall runs one call of the Auditor with per-attempt timeouts,
// retrying while the reply is lost (UNAVAILABLE, or an attempt that timed
// out while ctx has time left): Order and Validate are safe to repeat — an
// ordered request gets its token again, a validated transaction its
// approval. Errors come back as *Error, with the Auditor's kinds.
func auditorCall[T any](ctx context.Context, c *Client, f func(ctx context.Context, opts ...grpc.CallOption) (T, error)) (T, error) {
	var zero T
	for lost := 1; ; lost++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		var trailer metadata.MD
		out, err := f(actx, grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			return out, nil
		}
		code := status.Code(err)
		if !(code == codes.Unavailable || (code == codes.DeadlineExceeded && ctx.Err() == nil)) || lost >= c.cfg.MaxAttempts {
			return zero, fromStatus(err, trailer)
		}
		select {
		case <-ctx.Done():
			return zero, errors.Join(fromStatus(err, trailer), ctx.Err())
		case <-time.After(time.Duration(1<<min(lost, 6)) * 10 * time.Millisecond):
		}
	}
}

// needAuditor is the error of an Auditor call on a client in direct mode.
func (c *Client) needAuditor() error {
	if c.aud == nil {
		return errors.New("client: not in Auditor mode (Config.Mode)")
	}
	return nil
}

// Order asks the Auditor to order r (Auditor mode) and returns its token,
// checked: signed with the Auditor's key, for exactly r.
func (c *Client) Order(ctx context.Context, r *proof.Request) (*proof.OrderToken, error) {
	if err := c.needAuditor(); err != nil {
		return nil, err
	}
	key, err := c.auditorKey(ctx)
	if err != nil {
		return nil, err
	}
	req := wire.RequestToAPI(r)
	t, err := auditorCall(ctx, c, func(ctx context.Context, o ...grpc.CallOption) (*api.OrderToken, error) {
		return c.aud.api.Order(ctx, req, o...)
	})
	if err != nil {
		return nil, err
	}
	tok := wire.OrderTokenFromAPI(t)
	if tok.Nonce != r.Nonce || !bytes.Equal(tok.Digest, proof.RequestDigest(r)) {
		return nil, fmt.Errorf("%w: the Auditor's token names another request than %s", ErrBadReply, r.Nonce)
	}
	if err := proof.Verify(key, tok, tok.Signature); err != nil {
		return nil, fmt.Errorf("%w: the Auditor's token for %s: %v", ErrBadReply, r.Nonce, err)
	}
	return tok, nil
}

// Validate hands the ledger's result for r to the Auditor (Auditor mode)
// and returns its approval, checked: signed with the Auditor's key, for
// exactly res's receipt. A Byzantine fault of the ledger is an *Error
// whose cause is a *proof.ByzantineFault (errors.As; errors.Is with
// proof.ErrByzantineFault), naming the asset, the version and the check.
func (c *Client) Validate(ctx context.Context, r *proof.Request, res *proof.Result) (*proof.Approval, error) {
	if err := c.needAuditor(); err != nil {
		return nil, err
	}
	key, err := c.auditorKey(ctx)
	if err != nil {
		return nil, err
	}
	req := &api.ValidateRequest{Request: wire.RequestToAPI(r), Reply: wire.ResultToAPI(res)}
	a, err := auditorCall(ctx, c, func(ctx context.Context, o ...grpc.CallOption) (*api.Approval, error) {
		return c.aud.api.Validate(ctx, req, o...)
	})
	if err != nil {
		var f *proof.ByzantineFault
		if errors.As(err, &f) {
			f.Nonce = r.Nonce
		}
		return nil, err
	}
	ap := wire.ApprovalFromAPI(a)
	if ap.Nonce != r.Nonce || !bytes.Equal(ap.Digest, proof.ReceiptDigest(&res.Receipt)) {
		return nil, fmt.Errorf("%w: the Auditor's approval names another receipt than %s's", ErrBadReply, r.Nonce)
	}
	if err := proof.Verify(key, ap, ap.Signature); err != nil {
		return nil, fmt.Errorf("%w: the Auditor's approval of %s: %v", ErrBadReply, r.Nonce, err)
	}
	return ap, nil
}

// ExecuteAudited takes r through the Auditor's three phases (Auditor
// mode): Order, the ledger's execution with the token (ExecuteOrdered, with
// its retries), Validate. It returns the result with the Auditor's
// approval of its receipt, both verified: the ledger's signature by the
// Auditor, the approval's here. A request the ledger refused or failed
// returns the ledger's error; the Auditor settles its order when the
// lease runs out.
func (c *Client) ExecuteAudited(ctx context.Context, r *proof.Request) (*proof.Result, *proof.Approval, error) {
	tok, err := c.Order(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	res, err := c.ExecuteOrdered(ctx, r, tok)
	if err != nil {
		return nil, nil, err
	}
	ap, err := c.Validate(ctx, r, res)
	if err != nil {
		return nil, nil, err
	}
	return res, ap, nil
}

// auditorAdmin is ctx with the Auditor's administrator token.
func (c *Client) auditorAdmin(ctx context.Context) (context.Context, error) {
	tok := c.cfg.AuditorAdminToken
	if tok == "" {
		tok = c.cfg.AdminToken
	}
	if tok == "" {
		return nil, errors.New("client: registering an identity with the Auditor needs its administrator's token")
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), nil
}

// registerWithAuditor runs a registration on the Auditor too, in Auditor
// mode, after the ledger's (whose error ledgerErr is), whatever the
// ledger answered: both domains repeat a registration they hold, so a
// retry after one failed completes it. It returns both sides' errors.
func registerWithAuditor(ctx context.Context, c *Client, admin bool, ledgerErr error,
	f func(ctx context.Context, a api.AuditorClient, o ...grpc.CallOption) (*api.RegisterReply, error)) error {
	if c.aud == nil {
		return ledgerErr
	}
	if ledgerErr != nil {
		ledgerErr = fmt.Errorf("the ledger: %w", ledgerErr)
	}
	var err error
	if admin {
		if ctx, err = c.auditorAdmin(ctx); err != nil {
			return errors.Join(ledgerErr, err)
		}
	}
	_, err = auditorCall(ctx, c, func(ctx context.Context, o ...grpc.CallOption) (*api.RegisterReply, error) {
		return f(ctx, c.aud.api, o...)
	})
	if err != nil {
		err = fmt.Errorf("the Auditor: %w", err)
	}
	return errors.Join(ledgerErr, err)
}
