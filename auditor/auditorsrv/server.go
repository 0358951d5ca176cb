// Package auditorsrv is the Auditor's server: the gRPC service over an
// auditor.Auditor, and Start, which assembles a running Auditor from
// options — its own storage backend and keys, the ledger it recovers
// against, listener, metrics and logs — as package server does for the
// ledger. `kiroku auditor` runs it.
//
// # Trust
//
// The Auditor is the second domain: its operator is not the ledger's, and
// it trusts the ledger for nothing it can check. It needs, before it
// serves, the ledger's ECDSA proof key, which it pins: given as a PEM
// (Options.LedgerKey), or as the key's fingerprint, in which case it asks
// the ledger for its key (GetLedgerKey) at start and refuses to run unless
// the key returned has that fingerprint (computed here, not taken from the
// reply). A ledger with an HMAC proof key cannot be audited by another
// domain — whoever can check its proofs can forge them — and is refused.
// The ledger, in turn, is started with this Auditor's public key (`kiroku
// server --auditor-key`), printed by `kiroku keys auditor`.
//
// Clients enrol with the Auditor as with the ledger: identities by an
// administrator holding the Auditor's own bearer token, contracts signed
// by an enrolled identity. Order and Validate need no credentials beyond
// the request's own signature, which the Auditor verifies.
//
// # Keys
//
// On first start the server creates, in <data-dir>/keys, the Auditor's
// ECDSA P-256 key (auditor-ecdsa.pem), with which it signs order tokens,
// approvals and aborts, and the 32-byte key that seals clients' HMAC
// secrets at rest (secrets.key), as the ledger server does.
//
// # Recovery
//
// Every RecoverEvery (a quarter of the lease by default) the server runs
// auditor.Recover: an order whose lease ran out is settled against the
// ledger over the network (auditor.LedgerView: GetTxState, GetAsset and
// AbortNonce, the last signed with the Auditor's key). A fault found is
// logged at error level and counted; an error (the ledger unreachable) is
// logged at warning level, and the order is tried again on the next
// round.
package auditorsrv

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auditor"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
)

// Options configure Start.
type Options struct {
	// DataDir holds the key files and, for the embedded engine, its data.
	// Required.
	DataDir string
	// Listen is the gRPC address; "" means 127.0.0.1:50061, port 0 picks
	// one.
	Listen string
	// Backend names a backend of package backends: "engine" (default),
	// "postgres" or "cassandra". The Auditor's database is its own, never
	// the ledger's.
	Backend string
	// Storage configures the backend; for the engine, Dir defaults to
	// DataDir/engine.
	Storage backends.Config
	// MetricsListen serves Prometheus metrics at /metrics; "" disables.
	MetricsListen string
	// AdminToken enables identity registration for callers that present
	// it; "" disables it.
	AdminToken string
	// Ledger is the address of the ledger the Auditor recovers against
	// (host:port, or a cluster's members, comma-separated). Required.
	Ledger string
	// LedgerKey pins the ledger's ECDSA proof key: its PKIX public key in
	// PEM, or its fingerprint (64 hex digits, as GetLedgerKey and the
	// ledger's start-up log give it), then fetched from Ledger at start
	// and checked. Required.
	LedgerKey string
	// LedgerDial are added to the options of the connection to the ledger.
	LedgerDial []grpc.DialOption
	// Lease is how long an order holds its locks before recovery settles
	// it; 0 means 10 s.
	Lease time.Duration
	// RecoverEvery is how often recovery runs; 0 means Lease/4.
	RecoverEvery time.Duration
	// Limits bound the contracts the Auditor runs on its replica; run them
	// with the ledger's, or a request may pass one domain and fail the
	// other.
	Limits ledger.Limits
	// Transport bounds what client connections can make the server hold,
	// as for the ledger server.
	Transport server.TransportLimits
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// Running is a started Auditor server.
type Running struct {
	Auditor *auditor.Auditor
	Replica *ledger.Ledger
	Backend storage.Backend
	// Key is the Auditor's public key, as GetAuditorKey returns it.
	Key *api.AuditorKey

	grpc    *grpc.Server
	lis     net.Listener
	metrics *http.Server
	ledger  *client.Client
	log     *slog.Logger
	done    chan error
	serving bool

	stopRecovery context.CancelFunc // ends recovery, and a round under way
	recovering   sync.WaitGroup

	stopOnce sync.Once
	stopErr  error
}

// Addr is the address the gRPC server listens on.
func (r *Running) Addr() string { return r.lis.Addr().String() }

// ErrLedgerKey is the cause of a start refused because the ledger's key is
// not the one pinned, or not one another domain can check.
var ErrLedgerKey = errors.New("auditorsrv: the ledger's key cannot be trusted")

// Start opens the Auditor's backend and keys, pins the ledger's key, takes
// up the orders a previous run left, and serves the Auditor over gRPC
// (with server reflection) and runs recovery until Stop.
func Start(ctx context.Context, o Options) (_ *Running, err error) {
	switch {
	case o.DataDir == "":
		return nil, errors.New("auditorsrv: a data directory is required")
	case o.Ledger == "":
		return nil, errors.New("auditorsrv: the ledger's address is required")
	case o.LedgerKey == "":
		return nil, errors.New("auditorsrv: the ledger's proof key (PEM or fingerprint) is required")
	case o.Lease < 0 || o.RecoverEvery < 0:
		return nil, fmt.Errorf("auditorsrv: negative lease %v or recovery interval %v", o.Lease, o.RecoverEvery)
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:50061"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Lease == 0 {
		o.Lease = 10 * time.Second
	}
	if o.RecoverEvery == 0 {
		o.RecoverEvery = o.Lease / 4
	}
	t, err := o.Transport.Validated()
	if err != nil {
		return nil, err
	}
	keyDir := filepath.Join(o.DataDir, "keys")
	signer, key, err := loadKey(keyDir)
	if err != nil {
		return nil, err
	}
	boxKey, err := auth.LoadOrCreateSecretKey(filepath.Join(keyDir, "secrets.key"))
	if err != nil {
		return nil, err
	}
	box, err := auth.NewSecretBox(boxKey)
	if err != nil {
		return nil, err
	}

	r := &Running{Key: key, log: o.Logger, done: make(chan error, 1)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.ledger, err = client.Dial(client.Config{Server: o.Ledger, DialOptions: o.LedgerDial}); err != nil {
		return nil, err
	}
	ledgerKey, ledgerPrint, err := pinLedgerKey(ctx, r.ledger, o.LedgerKey)
	if err != nil {
		return nil, err
	}

	name := o.Backend
	if name == "" {
		name = "engine"
	}
	cfg := o.Storage
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(o.DataDir, "engine")
	}
	if cfg.Engine.Logf == nil {
		cfg.Engine.Logf = func(format string, args ...any) { o.Logger.Info(fmt.Sprintf(format, args...)) }
	}
	if r.Backend, err = backends.Open(ctx, name, cfg); err != nil {
		return nil, err
	}
	// The replica holds the ledger's versions and proof signatures, so its
	// proofs verify with the ledger's key; it never executes a request, so
	// its Signer (the Auditor's key) signs nothing.
	if r.Replica, err = ledger.Open(ctx, ledger.Config{Backend: r.Backend, Signer: signer, ProofVerifier: ledgerKey,
		Secrets: box, Limits: o.Limits}); err != nil {
		return nil, err
	}
	if r.Auditor, err = auditor.Open(ctx, auditor.Config{Replica: r.Replica, DB: r.Backend, Signer: signer, LedgerKey: ledgerKey,
		Ledger: &ledgerView{c: r.ledger, signer: signer}, Lease: o.Lease}); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	m := newMetrics(reg, r.Auditor)
	if r.grpc, err = server.NewGRPCServer(t, reg, o.Logger); err != nil {
		return nil, err
	}
	svc := &service{a: r.Auditor, replica: r.Replica, adminToken: o.AdminToken, key: key, metrics: m, log: o.Logger}
	server.RegisterService(r.grpc, &api.Auditor_ServiceDesc, svc, 0)
	reflection.Register(r.grpc)
	if r.lis, err = net.Listen("tcp", o.Listen); err != nil {
		return nil, fmt.Errorf("auditorsrv: %w", err)
	}
	r.lis = netutil.LimitListener(r.lis, t.MaxConnections)
	if o.MetricsListen != "" {
		mlis, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("auditorsrv: metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		r.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = r.metrics.Serve(mlis) }()
		o.Logger.Info("metrics", "addr", mlis.Addr().String())
	}
	r.serving = true
	go func() { r.done <- r.grpc.Serve(r.lis) }()
	rctx, cancel := context.WithCancel(context.Background())
	r.stopRecovery = cancel
	r.recovering.Add(1)
	go r.recover(rctx, o.RecoverEvery, m)
	o.Logger.Info("auditor started", "addr", r.Addr(), "backend", name, "auditor_key", key.Fingerprint,
		"ledger", o.Ledger, "ledger_key", ledgerPrint, "lease", o.Lease, "pending", r.Auditor.Pending(),
		"registration", o.AdminToken != "")
	return r, nil
}

// recover runs the Auditor's recovery every interval until ctx ends.
func (r *Running) recover(ctx context.Context, every time.Duration, m *metrics) {
	defer r.recovering.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := r.Auditor.Recover(ctx)
		m.recovered.Add(float64(n))
		if n > 0 {
			r.log.Info("recovery settled orders whose lease ran out", "settled", n, "pending", r.Auditor.Pending())
		}
		if err != nil && ctx.Err() == nil {
			r.logRecovery(err, m)
		}
	}
}

// logRecovery logs each error of a recovery round: a fault at error
// level, anything else (the ledger unreachable) as a warning.
func (r *Running) logRecovery(err error, m *metrics) {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var f *proof.ByzantineFault
		if errors.As(e, &f) {
			m.faults.WithLabelValues(f.Check).Inc()
			r.log.Error("Byzantine fault of the ledger", "phase", "recovery", "nonce", f.Nonce, "asset", f.Asset, "age", f.Age,
				"check", f.Check, "detail", f.Detail)
			continue
		}
		r.log.Warn("recovery could not settle an order; trying again", "err", e)
	}
}

// Stop stops accepting calls and recovery, lets running calls finish for
// up to grace, cancels the rest, and closes the backend. Orders not
// settled stay in the Auditor's database for the next start.
func (r *Running) Stop(grace time.Duration) error {
	r.stopOnce.Do(func() { r.stopErr = r.stop(grace) })
	return r.stopErr
}

func (r *Running) stop(grace time.Duration) error {
	r.stopRecovery()
	r.recovering.Wait()
	stopped := make(chan struct{})
	go func() { r.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		r.log.Warn("graceful stop timed out; cancelling calls", "grace", grace)
		r.grpc.Stop()
		<-stopped
	}
	if err := <-r.done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		r.log.Error("grpc serve", "err", err)
	}
	return r.close()
}

func (r *Running) close() error {
	var errs []error
	if r.metrics != nil {
		errs = append(errs, r.metrics.Close())
	}
	if r.lis != nil && !r.serving {
		errs = append(errs, r.lis.Close())
	}
	if r.ledger != nil {
		errs = append(errs, r.ledger.Close())
	}
	if r.Backend != nil {
		errs = append(errs, r.Backend.Close())
	}
	return errors.Join(errs...)
}

// keyFile is the Auditor's key in its data directory's keys/.
const keyFile = "auditor-ecdsa.pem"

// InitKey creates, in dataDir/keys, the Auditor's key as Start does on a
// first start, keeping one already there, and returns its public key
// (PEM) and fingerprint: what the ledger is started with.
func InitKey(dataDir string) (pubPEM []byte, fingerprint string, err error) {
	_, key, err := loadKey(filepath.Join(dataDir, "keys"))
	if err != nil {
		return nil, "", err
	}
	return []byte(key.PublicKeyPem), key.Fingerprint, nil
}

// loadKey loads or creates the Auditor's key in dir.
func loadKey(dir string) (auth.Signer, *api.AuditorKey, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("auditorsrv: %w", err)
	}
	k, err := auth.LoadOrCreateECDSAKey(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, nil, err
	}
	s, err := auth.NewECDSASigner(k)
	if err != nil {
		return nil, nil, err
	}
	pub, err := auth.MarshalPublicKeyPEM(&k.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	return s, &api.AuditorKey{Scheme: auth.SchemeECDSA.String(), PublicKeyPem: string(pub), Fingerprint: auth.Fingerprint(&k.PublicKey)}, nil
}

// pinLedgerKey returns the verifier of the ledger's proof key pin names:
// the PEM itself, or the key the ledger serves if its fingerprint is pin.
func pinLedgerKey(ctx context.Context, c *client.Client, pin string) (auth.Verifier, string, error) {
	pemBytes := []byte(pin)
	if !strings.Contains(pin, "-----BEGIN ") {
		want := strings.ToLower(strings.TrimSpace(pin))
		if b, err := hex.DecodeString(want); err != nil || len(b) != 32 {
			return nil, "", fmt.Errorf("%w: %q is neither a PEM public key nor a fingerprint (64 hex digits)", ErrLedgerKey, pin)
		}
		k, err := c.LedgerKey(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("auditorsrv: asking the ledger for its key: %w", err)
		}
		if k.Scheme != auth.SchemeECDSA.String() {
			return nil, "", fmt.Errorf("%w: the ledger signs with %s; another domain can audit only an ECDSA proof key", ErrLedgerKey, k.Scheme)
		}
		pemBytes = []byte(k.PublicKeyPem)
		pub, err := auth.ParsePublicKeyPEM(pemBytes)
		if err != nil {
			return nil, "", fmt.Errorf("%w: the ledger's key: %v", ErrLedgerKey, err)
		}
		if got := auth.Fingerprint(pub); got != want {
			return nil, "", fmt.Errorf("%w: the ledger serves key %s, not the pinned %s", ErrLedgerKey, got, want)
		}
	}
	pub, err := auth.ParsePublicKeyPEM(pemBytes)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrLedgerKey, err)
	}
	v, err := auth.NewECDSAVerifier(pub)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrLedgerKey, err)
	}
	return v, auth.Fingerprint(pub), nil
}

// metrics are the Auditor's own, beside the RPC metrics.
type metrics struct {
	faults    *prometheus.CounterVec
	recovered prometheus.Counter
}

func newMetrics(reg *prometheus.Registry, a *auditor.Auditor) *metrics {
	m := &metrics{
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiroku_auditor_faults_total",
			Help: "Byzantine faults of the ledger found, by the check that failed."}, []string{"check"}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{Name: "kiroku_auditor_recovered_total",
			Help: "Orders whose lease ran out that recovery settled."}),
	}
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kiroku_auditor_pending_orders",
		Help: "Requests ordered and not yet settled."}, func() float64 { return float64(a.Pending()) })
	reg.MustRegister(m.faults, m.recovered, pending)
	return m
}

// ledgerView is auditor.LedgerView over the ledger's gRPC API, through the
// SDK (retries, and a cluster's leader followed).
type ledgerView struct {
	c      *client.Client
	signer auth.Signer
}

func (v *ledgerView) TxState(ctx context.Context, nonce string) (*proof.TxState, error) {
	return v.c.TxState(ctx, nonce)
}

// Version reads the version with GetAsset, which returns it whole, proof
// signature included.
func (v *ledgerView) Version(ctx context.Context, id string, age int64) (*proof.Version, error) {
	vs, err := v.c.History(ctx, id, proof.ScanRange{Start: age, End: age, Ascending: true, Limit: 1})
	if err != nil {
		return nil, err
	}
	if len(vs) != 1 || vs[0].ID != id || vs[0].Age != age {
		return nil, fmt.Errorf("%w: the ledger returned %d versions for %s@%d", client.ErrBadReply, len(vs), id, age)
	}
	return vs[0], nil
}

// abortTTL is how long a signed abort is good for: the ledger refuses it
// after, so a copy of it cannot be sent later.
const abortTTL = time.Minute

func (v *ledgerView) AbortNonce(ctx context.Context, nonce, reason string) (*proof.TxState, error) {
	r := &proof.AbortRequest{Nonce: nonce, Reason: reason, Deadline: time.Now().Add(abortTTL).UnixMilli()}
	sig, err := proof.Sign(v.signer, r)
	if err != nil {
		return nil, err
	}
	r.Signature = sig
	return v.c.AbortNonce(ctx, r)
}

var _ auditor.LedgerView = (*ledgerView)(nil)
