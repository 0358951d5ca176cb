// Package server is kiroku's ledger server: the gRPC service over
// ledger.Ledger, and Start, which assembles a running server from options —
// storage backend, key files, listener, metrics and logs. `kiroku server`,
// `kiroku demo` and `kiroku bench ledger` all start servers through it.
//
// # Trust model
//
// The ledger's operator runs the server. Clients authenticate every
// request with their own key (an HMAC secret or an ECDSA certificate);
// identities are enrolled by an administrator, who proves itself with a
// bearer token given to the server at start (--admin-token-file or
// KIROKU_ADMIN_TOKEN). Without a token, nobody can enrol identities, so a
// server cannot be opened to strangers by accident. Contracts are registered
// by enrolled identities and signed. Read calls (assets, proofs, transaction
// states, validation) need no credentials: the data is meant to be audited,
// and the channel is expected to be protected by the network (the server
// binds loopback unless told otherwise; TLS is not built in yet). What one
// such call may cost is bounded: a validation checks at most
// Limits.MaxValidateVersions versions and says where it stopped.
//
// # Keys
//
// On first start the server creates, in <data-dir>/keys, the ledger's proof
// key (ECDSA P-256, ledger-ecdsa.pem; or a 32-byte HMAC key, ledger-hmac.key,
// with --proof-scheme=hmac) and the 32-byte server key that seals clients'
// HMAC secrets at rest (secrets.key). Both are created atomically and
// fsynced, mode 0600.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/postgres"
)

// Options configure Start.
type Options struct {
	// DataDir holds the key files and, for the embedded engine, its data.
	// Required.
	DataDir string
	// Listen is the gRPC address; "" means 127.0.0.1:50051, port 0 picks one.
	Listen string
	// Backend is "engine" (default) or "postgres".
	Backend string
	// PostgresDSN is the database for the postgres backend.
	PostgresDSN string
	// Engine tunes the embedded engine; Dir is set from DataDir.
	Engine engine.Config
	// MetricsListen serves Prometheus metrics at /metrics; "" disables.
	MetricsListen string
	// AdminToken enables identity registration for callers that present it.
	AdminToken string
	// ProofScheme is how the ledger signs proofs: auth.SchemeECDSA (default)
	// or auth.SchemeHMAC.
	ProofScheme auth.Scheme
	// Limits bound contract executions.
	Limits ledger.Limits
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// Running is a started server.
type Running struct {
	Ledger  *ledger.Ledger
	Backend storage.Backend
	Key     *api.LedgerKey
	// ProofVerifier checks the ledger's proofs and receipts (for an HMAC
	// proof key, whoever holds it can also forge them).
	ProofVerifier auth.Verifier

	grpc    *grpc.Server
	lis     net.Listener
	metrics *http.Server
	log     *slog.Logger
	done    chan error
	serving bool          // grpc.Serve owns the listener
	closing chan struct{} // closed by stop: CallBatches streams wind down

	stopOnce sync.Once
	stopErr  error
}

// Addr is the address the gRPC server listens on.
func (r *Running) Addr() string { return r.lis.Addr().String() }

// Start opens the backend and keys, and serves the ledger over gRPC (with
// server reflection) until Stop.
func Start(ctx context.Context, o Options) (_ *Running, err error) {
	if o.DataDir == "" {
		return nil, errors.New("server: a data directory is required")
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:50051"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ProofScheme == 0 {
		o.ProofScheme = auth.SchemeECDSA
	}
	keyDir := filepath.Join(o.DataDir, "keys")
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	signer, verifier, key, err := proofKey(keyDir, o.ProofScheme)
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

	r := &Running{Key: key, ProofVerifier: verifier, log: o.Logger, done: make(chan error, 1)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	switch o.Backend {
	case "", "engine":
		cfg := o.Engine
		cfg.Dir = filepath.Join(o.DataDir, "engine")
		if cfg.Logf == nil { // recovery and checkpoints, for the operator
			cfg.Logf = func(format string, args ...any) { o.Logger.Info(fmt.Sprintf(format, args...)) }
		}
		if r.Backend, err = engine.Open(cfg); err != nil {
			return nil, err
		}
	case "postgres":
		if o.PostgresDSN == "" {
			return nil, errors.New("server: the postgres backend needs a DSN")
		}
		if r.Backend, err = postgres.Open(ctx, postgres.Config{DSN: o.PostgresDSN}); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("server: unknown backend %q (engine or postgres)", o.Backend)
	}
	if r.Ledger, err = ledger.Open(ctx, ledger.Config{Backend: r.Backend, Signer: signer, ProofVerifier: verifier,
		Secrets: box, Limits: o.Limits}); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	observe := m.interceptor(o.Logger)
	// Stream workers reuse goroutines whose stacks have already grown to
	// the depth of an execute; a fresh goroutine per call spent ~8% of the
	// CPU copying stacks under load.
	r.grpc = grpc.NewServer(grpc.ChainUnaryInterceptor(observe),
		grpc.NumStreamWorkers(uint32(4*runtime.GOMAXPROCS(0))),
		grpc.StaticStreamWindowSize(api.StreamWindow), grpc.StaticConnWindowSize(api.ConnWindow))
	r.closing = make(chan struct{})
	api.RegisterLedgerServer(r.grpc, &service{l: r.Ledger, adminToken: o.AdminToken, key: key, observe: observe, closing: r.closing})
	reflection.Register(r.grpc)
	if r.lis, err = net.Listen("tcp", o.Listen); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if o.MetricsListen != "" {
		mlis, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		r.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = r.metrics.Serve(mlis) }()
		o.Logger.Info("metrics", "addr", mlis.Addr().String())
	}
	r.serving = true
	go func() { r.done <- r.grpc.Serve(r.lis) }()
	o.Logger.Info("ledger server started", "addr", r.Addr(), "backend", backendName(o.Backend),
		"proof_scheme", key.Scheme, "proof_key", key.Fingerprint, "registration", o.AdminToken != "")
	return r, nil
}

func backendName(b string) string {
	if b == "" {
		return "engine"
	}
	return b
}

// Stop stops accepting calls, lets running calls finish for up to grace,
// cancels the rest, and closes the backend.
func (r *Running) Stop(grace time.Duration) error {
	r.stopOnce.Do(func() { r.stopErr = r.stop(grace) })
	return r.stopErr
}

func (r *Running) stop(grace time.Duration) error {
	stopped := make(chan struct{})
	close(r.closing) // CallBatches streams end once their calls are answered
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
	if r.Backend != nil {
		errs = append(errs, r.Backend.Close())
	}
	return errors.Join(errs...)
}

// LoadProofVerifier loads, or creates, the proof key of a server whose
// data directory is dir, and returns its verifier: a process that starts
// the server in a child (the split bench) verifies HMAC proofs with it.
func LoadProofVerifier(dir string, scheme auth.Scheme) (auth.Verifier, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	_, v, _, err := proofKey(dir, scheme)
	return v, err
}

// proofKey loads or creates the ledger's proof key.
func proofKey(dir string, scheme auth.Scheme) (auth.Signer, auth.Verifier, *api.LedgerKey, error) {
	switch scheme {
	case auth.SchemeECDSA:
		k, err := auth.LoadOrCreateECDSAKey(filepath.Join(dir, "ledger-ecdsa.pem"))
		if err != nil {
			return nil, nil, nil, err
		}
		s, err := auth.NewECDSASigner(k)
		if err != nil {
			return nil, nil, nil, err
		}
		v, err := auth.NewECDSAVerifier(&k.PublicKey)
		if err != nil {
			return nil, nil, nil, err
		}
		pub, err := auth.MarshalPublicKeyPEM(&k.PublicKey)
		if err != nil {
			return nil, nil, nil, err
		}
		return s, v, &api.LedgerKey{Scheme: scheme.String(), PublicKeyPem: string(pub), Fingerprint: auth.Fingerprint(&k.PublicKey)}, nil
	case auth.SchemeHMAC:
		secret, err := auth.LoadOrCreateSecretKey(filepath.Join(dir, "ledger-hmac.key"))
		if err != nil {
			return nil, nil, nil, err
		}
		s, err := auth.NewHMACSigner(secret)
		if err != nil {
			return nil, nil, nil, err
		}
		v, err := auth.NewHMACVerifier(secret)
		if err != nil {
			return nil, nil, nil, err
		}
		return s, v, &api.LedgerKey{Scheme: scheme.String(), Fingerprint: auth.HMACKeyFingerprint(secret)}, nil
	}
	return nil, nil, nil, fmt.Errorf("server: unknown proof scheme %v", scheme)
}

// metrics are the server's Prometheus metrics.
type metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiroku_rpc_calls_total",
			Help: "Ledger RPCs by method and gRPC status code."}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kiroku_rpc_duration_seconds",
			Help: "Ledger RPC latency by method.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"method"}),
	}
	reg.MustRegister(m.calls, m.duration, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) interceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		method := filepath.Base(info.FullMethod)
		code := status.Code(err)
		m.calls.WithLabelValues(method, code.String()).Inc()
		m.duration.WithLabelValues(method).Observe(time.Since(start).Seconds())
		if err != nil {
			level := slog.LevelDebug
			if code == codes.Internal || code == codes.Unknown {
				level = slog.LevelError
			}
			log.Log(ctx, level, "rpc failed", "method", method, "code", code.String(), "err", err)
		}
		return resp, err
	}
}
