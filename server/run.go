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
// A server started with an Auditor's public key (Options.AuditorKeyPEM,
// --auditor-key) trusts that Auditor, the second domain, for two things
// only: it runs a request only with the Auditor's signed, unexpired
// order token for exactly that request, and it lets the Auditor alone
// (a signed proof.AbortRequest) record a nonce as aborted. The Auditor's
// server is package auditor/auditorsrv.
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
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
)

// Options configure Start.
type Options struct {
	// DataDir holds the key files and, for the embedded engine, its data.
	// Required.
	DataDir string
	// Listen is the gRPC address; "" means 127.0.0.1:50051, port 0 picks one.
	Listen string
	// Backend names a backend of package backends: "engine" (default),
	// "postgres" or "cassandra".
	Backend string
	// PostgresDSN is the database for the postgres backend.
	PostgresDSN string
	// CassandraContacts are the contact points (host:port,...) for the
	// cassandra backend, whose transactions are storage/coordinator's.
	CassandraContacts string
	// CassandraKeyspace is the keyspace kiroku keeps its tables in; ""
	// takes the cassandra package's default.
	CassandraKeyspace string
	// CassandraConsistency, CassandraSerialConsistency and
	// CassandraLocalDC are backends.Config's Consistency,
	// SerialConsistency and LocalDC.
	CassandraConsistency, CassandraSerialConsistency, CassandraLocalDC string
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
	// Transport bounds what client connections can make the server hold.
	Transport TransportLimits
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// AuditorKeyPEM, if set, is the PKIX public key (PEM) of the Auditor
	// this ledger runs with (package auditor): the ledger then executes a
	// request only with that Auditor's order token for it, and serves
	// AbortNonce to requests signed with that key. Empty: no Auditor.
	AuditorKeyPEM []byte
	// Cluster, if set, makes the server a member of a replicated cluster
	// of embedded engines (ClusterOptions); Listen then defaults to the
	// member's address among the peers.
	Cluster *ClusterOptions
}

// TransportLimits bound what a client can make the server hold before any
// request of its is authenticated (requests are signed one by one, so a
// connection is anyone's). Request bytes a connection can have the server
// buffer are at most MaxStreams × MaxRequestBytes (a stream's flow-control
// window, 1 MiB, is smaller), each for at most BodyTimeout on a unary
// call; with MaxConnections that bounds them server-wide. Zero fields take
// the defaults named; negative ones are refused.
type TransportLimits struct {
	// MaxConnections bounds the client connections open at once; more
	// wait to be accepted. 0 means 1024.
	MaxConnections int
	// MaxStreams bounds the calls (HTTP/2 streams) open at once on one
	// connection; a client's further calls wait for one to end. 0 means
	// 16. (The Go SDK multiplexes its executions over one stream.)
	MaxStreams int
	// MaxRequestBytes bounds one request message, in bytes; a larger one
	// is refused with RESOURCE_EXHAUSTED. 0 means 2 MiB, room for the Go
	// SDK's 1 MiB batches of calls and for a contract of the largest
	// source ledger.Limits allows by default.
	MaxRequestBytes int
	// BodyTimeout bounds the time from a unary call's headers to the end
	// of its request message; a call still incomplete then is cancelled and
	// its bytes dropped. 0 means 10 s.
	BodyTimeout time.Duration
	// IdleTimeout closes a connection that has had no call open for this
	// long. 0 means 5 minutes.
	IdleTimeout time.Duration
}

// maxHeaderBytes bounds a call's header list (gRPC's default is 16 MiB);
// kiroku's calls carry their data in the message, not in metadata.
const maxHeaderBytes = 64 << 10

// streamWindow is the server's receive window per stream: what a client
// may send on a stream that the server is not reading yet. A window only
// throttles what the client sends; replies go at the client's windows.
const streamWindow = 1 << 20

func (t *TransportLimits) validate() error {
	if t.MaxConnections < 0 || t.MaxStreams < 0 || t.MaxRequestBytes < 0 || t.BodyTimeout < 0 || t.IdleTimeout < 0 {
		return fmt.Errorf("server: negative transport limit in %+v", *t)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&t.MaxConnections, 1024)
	def(&t.MaxStreams, 16)
	def(&t.MaxRequestBytes, 2<<20)
	if t.BodyTimeout == 0 {
		t.BodyTimeout = 10 * time.Second
	}
	if t.IdleTimeout == 0 {
		t.IdleTimeout = 5 * time.Minute
	}
	return nil
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

	recovery  engine.RecoveryStats // the embedded engine's, at Open
	member    *member              // a cluster member's, or nil
	memberErr error                // what closing it returned

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
		if o.Cluster != nil && o.Cluster.Peers[o.Cluster.NodeID] != "" {
			o.Listen = o.Cluster.Peers[o.Cluster.NodeID]
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ProofScheme == 0 {
		o.ProofScheme = auth.SchemeECDSA
	}
	if err := o.Transport.validate(); err != nil {
		return nil, err
	}
	keyDir := filepath.Join(o.DataDir, "keys")
	if o.Cluster != nil {
		if o.Backend != "" && o.Backend != "engine" {
			return nil, fmt.Errorf("server: a cluster member runs the embedded engine, not %q", o.Backend)
		}
		if err := checkClusterKeys(keyDir, o); err != nil {
			return nil, err
		}
	}
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

	var auditorKey auth.Verifier
	auditorPrint := ""
	if len(o.AuditorKeyPEM) > 0 {
		pub, err := auth.ParsePublicKeyPEM(o.AuditorKeyPEM)
		if err != nil {
			return nil, fmt.Errorf("server: the Auditor's key: %w", err)
		}
		if auditorKey, err = auth.NewECDSAVerifier(pub); err != nil {
			return nil, fmt.Errorf("server: the Auditor's key: %w", err)
		}
		auditorPrint = auth.Fingerprint(pub)
	}

	r := &Running{Key: key, ProofVerifier: verifier, log: o.Logger, done: make(chan error, 1)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	openLedger := func(b storage.Backend) (*ledger.Ledger, error) {
		return ledger.Open(ctx, ledger.Config{Backend: b, Signer: signer, ProofVerifier: verifier, Secrets: box, Limits: o.Limits,
			Auditor: auditorKey})
	}
	switch {
	case o.Cluster != nil:
		if r.member, err = openMember(o, func(b storage.Backend) (*ledger.Ledger, error) {
			// The server's context may be gone by the time it leads.
			return ledger.Open(context.Background(), ledger.Config{Backend: b, Signer: signer, ProofVerifier: verifier,
				Secrets: box, Limits: o.Limits, Auditor: auditorKey})
		}); err != nil {
			return nil, err
		}
	default:
		name := o.Backend
		if name == "" {
			name = "engine"
		}
		cfg := backends.Config{Dir: filepath.Join(o.DataDir, "engine"), Engine: o.Engine, DSN: o.PostgresDSN, Contacts: o.CassandraContacts, Keyspace: o.CassandraKeyspace,
			Consistency: o.CassandraConsistency, SerialConsistency: o.CassandraSerialConsistency, LocalDC: o.CassandraLocalDC}
		if cfg.Engine.Logf == nil { // recovery and checkpoints, for the operator
			cfg.Engine.Logf = func(format string, args ...any) { o.Logger.Info(fmt.Sprintf(format, args...)) }
		}
		b, err := backends.Open(ctx, name, cfg)
		if err != nil {
			return nil, err
		}
		r.Backend = b
		if db, ok := b.(*engine.DB); ok {
			r.recovery = db.Recovery()
			reportRecovery(o.Logger, r.recovery)
		}
	}
	if r.member == nil {
		if r.Ledger, err = openLedger(r.Backend); err != nil {
			return nil, err
		}
	}

	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	if _, ok := r.Backend.(*engine.DB); ok {
		registerRecovery(reg, r.recovery)
	}
	observe := m.interceptor(o.Logger)
	t := o.Transport
	maxRecv, maxRequest := t.MaxRequestBytes, 0
	if r.member != nil && maxRecv < peerBatchBytes {
		// The peers' messages are larger; clients' are held to the bound
		// as they are received (lenientRequest).
		maxRecv, maxRequest = peerBatchBytes, t.MaxRequestBytes
	}
	r.grpc = newGRPC(t, maxRecv, observe)
	r.closing = make(chan struct{})
	svc := &service{l: r.Ledger, member: r.member, maxRequest: maxRequest, adminToken: o.AdminToken, key: key, observe: observe, closing: r.closing}
	register(r.grpc, svc)
	if r.member != nil {
		r.member.tr.Register(r.grpc)
		api.RegisterClusterServer(r.grpc, &clusterService{m: r.member, admin: svc.requireAdmin})
	}
	reflection.Register(r.grpc)
	if r.lis, err = net.Listen("tcp", o.Listen); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	r.lis = netutil.LimitListener(r.lis, t.MaxConnections)
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
	if r.member != nil {
		r.member.start()
	}
	o.Logger.Info("ledger server started", "addr", r.Addr(), "backend", backendName(o.Backend),
		"proof_scheme", key.Scheme, "proof_key", key.Fingerprint, "registration", o.AdminToken != "", "auditor_key", auditorPrint)
	return r, nil
}

// newGRPC returns a gRPC server bounded by t, taking messages of up to
// maxRecv bytes, its unary calls observed by observe.
func newGRPC(t TransportLimits, maxRecv int, observe grpc.UnaryServerInterceptor) *grpc.Server {
	body := newBodyTimer(t.BodyTimeout)
	// Stream workers reuse goroutines whose stacks have already grown to
	// the depth of an execute; a fresh goroutine per call spent ~8% of the
	// CPU copying stacks under load.
	return grpc.NewServer(grpc.ChainUnaryInterceptor(body.stop, observe),
		grpc.InTapHandle(body.start),
		grpc.NumStreamWorkers(uint32(4*runtime.GOMAXPROCS(0))),
		grpc.MaxConcurrentStreams(uint32(t.MaxStreams)),
		grpc.MaxRecvMsgSize(maxRecv),
		grpc.MaxHeaderListSize(maxHeaderBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: t.IdleTimeout, Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(api.ConnWindow))
}

// NewGRPCServer returns a gRPC server made as Start makes the ledger's,
// for another of kiroku's services (the Auditor's, package
// auditor/auditorsrv): bounded by t (defaults filled in; a negative
// field is an error), a unary call's request message held to
// t.BodyTimeout, and every unary call counted and timed in reg
// (kiroku_rpc_calls_total, kiroku_rpc_duration_seconds, with the Go and
// process collectors) and logged to log when it fails, as the ledger's
// are. Register services on it with RegisterService; the caller listens
// (at most t.MaxConnections connections: netutil.LimitListener) and serves.
func NewGRPCServer(t TransportLimits, reg *prometheus.Registry, log *slog.Logger) (*grpc.Server, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	return newGRPC(t, t.MaxRequestBytes, newMetrics(reg).interceptor(log)), nil
}

// Validated returns t with its defaults filled in, or an error for a
// negative field.
func (t TransportLimits) Validated() (TransportLimits, error) {
	err := t.validate()
	return t, err
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
	if r.member != nil {
		// A member leaves its cluster first: its peers' streams would hold
		// the graceful stop, and its clients' calls still running fail
		// over to the next leader (a commit in flight is reported unknown,
		// and the SDK finds out with the same nonce).
		r.memberErr = r.member.close()
	}
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
	if r.member != nil && !r.serving {
		errs = append(errs, r.member.close())
	}
	errs = append(errs, r.memberErr)
	return errors.Join(errs...)
}

// Failed is, for a cluster member, a channel that receives the error
// that stopped it for good (its Raft log could not be made durable): the
// server answers no more calls and must be stopped. nil for a single
// server.
func (r *Running) Failed() <-chan error {
	if r.member == nil {
		return nil
	}
	return r.member.failed
}

// InitKeys creates, in dataDir/keys, the proof key of scheme and the
// secrets key, as Start does on a first start, keeping keys already there,
// and returns the proof key's fingerprint. The members of a cluster share
// these files.
func InitKeys(dataDir string, scheme auth.Scheme) (string, error) {
	dir := filepath.Join(dataDir, "keys")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("server: %w", err)
	}
	_, _, key, err := proofKey(dir, scheme)
	if err != nil {
		return "", err
	}
	if _, err := auth.LoadOrCreateSecretKey(filepath.Join(dir, "secrets.key")); err != nil {
		return "", err
	}
	return key.Fingerprint, nil
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

// reportRecovery logs what the embedded engine's recovery did: a warning
// if it dropped anything (never-acknowledged records of a torn write or of
// void epochs), with what and how much.
func reportRecovery(log *slog.Logger, rec engine.RecoveryStats) {
	args := []any{"checkpoints", rec.Checkpoints, "log_records", rec.Records}
	if !rec.Dropped() {
		log.Info("engine recovered", args...)
		return
	}
	if rec.VoidRecords != 0 {
		args = append(args, "void_epochs", fmt.Sprintf("%d..%d", rec.VoidFrom, rec.VoidTo), "void_records", rec.VoidRecords, "void_bytes", rec.VoidBytes)
	}
	for _, t := range rec.TornTails {
		args = append(args, "torn_tail", fmt.Sprintf("%d bytes: %s", t.Bytes, t.Detail))
	}
	log.Warn("engine recovered, dropping writes that were never acknowledged", args...)
}

// bodyTimer cancels a unary call whose request message has not arrived
// whole within its timeout of the call's headers: gRPC holds the bytes of
// a partial message for as long as its sender waits. start (the tap
// handle, run as the headers arrive) arms a timer that cancels the call's
// context, which ends the read of the message; stop (the first unary
// interceptor, run once the message is decoded) disarms it.
type bodyTimer struct {
	timeout time.Duration
	streams map[string]bool // streaming methods: their messages come and go
}

type bodyTimerKey struct{}

func newBodyTimer(timeout time.Duration) *bodyTimer {
	b := &bodyTimer{timeout: timeout, streams: map[string]bool{}}
	for _, sd := range api.Ledger_ServiceDesc.Streams {
		b.streams["/"+api.Ledger_ServiceDesc.ServiceName+"/"+sd.StreamName] = true
	}
	return b
}

func (b *bodyTimer) start(ctx context.Context, info *tap.Info) (context.Context, error) {
	if b.streams[info.FullMethodName] || strings.HasPrefix(info.FullMethodName, "/grpc.reflection.") {
		return ctx, nil
	}
	// The call's own context ends with the call, and this one with it.
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(b.timeout, func() { cancel(errBodyTimeout) })
	return context.WithValue(ctx, bodyTimerKey{}, t), nil
}

var errBodyTimeout = errors.New("server: the request message did not arrive in time")

func (b *bodyTimer) stop(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if t, ok := ctx.Value(bodyTimerKey{}).(*time.Timer); ok && !t.Stop() {
		return nil, status.Errorf(codes.DeadlineExceeded, "the request message took longer than %v to arrive", b.timeout)
	}
	return h(ctx, req)
}

// metrics are the server's Prometheus metrics.
type metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiroku_rpc_calls_total",
			Help: "RPCs by method and gRPC status code."}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kiroku_rpc_duration_seconds",
			Help: "RPC latency by method.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"method"}),
	}
	reg.MustRegister(m.calls, m.duration, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerRecovery exports what the embedded engine's recovery dropped.
func registerRecovery(reg *prometheus.Registry, rec engine.RecoveryStats) {
	records := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kiroku_engine_recovery_dropped_records",
		Help: "Log records the embedded engine's recovery dropped at start-up, never acknowledged, by reason (void_epochs: written past the durable epoch)."}, []string{"reason"})
	bytes := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kiroku_engine_recovery_dropped_bytes",
		Help: "Log bytes the embedded engine's recovery dropped at start-up, never acknowledged, by reason (torn_tail: a partial write cut; void_epochs)."}, []string{"reason"})
	var torn int64
	for _, t := range rec.TornTails {
		torn += t.Bytes
	}
	records.WithLabelValues("void_epochs").Set(float64(rec.VoidRecords))
	bytes.WithLabelValues("void_epochs").Set(float64(rec.VoidBytes))
	bytes.WithLabelValues("torn_tail").Set(float64(torn))
	reg.MustRegister(records, bytes)
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
