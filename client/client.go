// Package client is kiroku's Go SDK: it signs requests with the client's
// identity and calls a ledger server over gRPC.
//
// Every call takes a context; its deadline bounds the whole call, retries
// included. Execute retries a request whose reply was lost (the connection
// failed or an attempt timed out) with the same nonce: the ledger accepts a
// nonce once, so a retry can never apply the contract twice. If a retry
// finds the nonce already used, the client asks for the transaction's
// recorded state and returns the original outcome — the result and its
// proofs if it committed, its error if it aborted.
//
// Errors wrap the ledger's sentinels (proof.ErrContractFailed, ...; see
// Error), or one of this package's: ErrConflict, a transaction the ledger
// aborted because it conflicted with others on every attempt it made —
// nothing was committed, and the same request (NewRequest's result, same
// nonce) may be sent again with ExecuteRequest; ErrBadReply, a reply that
// does not answer its call, from a broken or dishonest server. An
// overloaded server (proof.ErrOverloaded, no room for another contract)
// answers UNAVAILABLE and is retried like a lost reply.
//
// In Auditor mode (Config.Mode) Execute takes each request through the
// Auditor, the second domain: Order (a token the ledger requires), the
// ledger's execution, Validate. It returns a result only with the
// Auditor's approval of its receipt, verified with the Auditor's pinned
// key; a ledger whose signed result disagrees with the Auditor's run is a
// *proof.ByzantineFault (errors.As), naming the asset, version and check.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/wire"
)

// MaxReplyBytes is the largest reply the client accepts (gRPC's default
// is 4 MiB): an execute's reply grows with its writes and inputs, and the
// ledger refuses, before committing, one over its own MaxReplyBytes
// (16 MiB by default).
const MaxReplyBytes = 64 << 20

// Config is a client's identity and server. Exactly one of Secret and
// PrivateKeyPEM must be set (to sign requests); Certificate is needed only
// to register the certificate.
type Config struct {
	// Server is host:port, or a comma-separated list of a cluster's
	// members; "" means 127.0.0.1:50051.
	Server     string `json:"server"`
	Entity     string `json:"entity"`      // the client's entity id
	KeyVersion uint32 `json:"key_version"` // 0 means 1
	// Secret is the HMAC-SHA256 secret, hex in files and the environment.
	Secret []byte `json:"-"`
	// PrivateKeyPEM and CertificatePEM are the ECDSA P-256 identity.
	PrivateKeyPEM  []byte `json:"-"`
	CertificatePEM []byte `json:"-"`
	// AdminToken authorises identity registration.
	AdminToken string `json:"-"`
	// AttemptTimeout bounds one attempt of a call; 0 means 10s.
	AttemptTimeout time.Duration `json:"-"`
	// MaxAttempts bounds the tries of a call whose reply was lost; 0 means 5.
	MaxAttempts int `json:"-"`
	// DialOptions are added to the connection's (interceptors, TLS).
	DialOptions []grpc.DialOption `json:"-"`
	// LeaderWait bounds how long a call waits for a cluster to have a
	// leader it can reach (an election after the leader failed takes one
	// to two seconds by default); 0 means 10s.
	LeaderWait time.Duration `json:"-"`
	// UnaryCalls sends each execute and transaction-state call as a unary
	// RPC of its own, instead of over the CallBatches stream the client's
	// goroutines share (which unary interceptors do not see).
	UnaryCalls bool `json:"-"`

	// Mode is how executions go: ModeDirect ("direct"; "" means it) to the
	// ledger alone; ModeValidator ("validator") to the ledger, logged first
	// by a Validator over the database Validator names; or ModeAuditor
	// ("auditor") through the Auditor at Auditor, which orders each
	// request, and validates and countersigns the ledger's result before
	// Execute returns it (ExecuteAudited). Identity and contract
	// registrations then go to both domains.
	Mode string `json:"mode"`
	// Validator is the Validator's database, for ModeValidator:
	// "engine:DIR", "postgres:DSN" or "cassandra:HOST:PORT,...". The SDK
	// carries it for the Validator that wraps the client.
	Validator string `json:"validator"`
	// Auditor is the Auditor's host:port, for ModeAuditor.
	Auditor string `json:"auditor"`
	// AuditorKey pins the Auditor's key, for ModeAuditor (required): its
	// ECDSA public key in PEM, or the key's fingerprint (SHA-256 of its
	// PKIX encoding, 64 hex digits), in which case the client fetches the
	// key from the Auditor and uses it only if its fingerprint, computed
	// here, is this one.
	AuditorKey string `json:"-"`
	// AuditorAdminToken authorises identity registration with the
	// Auditor, whose administrator is not the ledger's; "" means
	// AdminToken.
	AuditorAdminToken string `json:"-"`
}

// fileConfig is the JSON form of Config: keys are named by file (or given
// as hex for the secret).
type fileConfig struct {
	Server         string `json:"server"`
	Entity         string `json:"entity"`
	KeyVersion     uint32 `json:"key_version"`
	SecretHex      string `json:"secret_hex"`
	SecretFile     string `json:"secret_file"`
	PrivateKeyFile string `json:"private_key_file"`
	CertFile       string `json:"certificate_file"`
	AdminTokenFile string `json:"admin_token_file"`
	Mode           string `json:"mode"`
	Validator      string `json:"validator"`
	Auditor        string `json:"auditor"`
	// AuditorKey is a fingerprint or PEM text; AuditorKeyFile a PEM file.
	AuditorKey            string `json:"auditor_key"`
	AuditorKeyFile        string `json:"auditor_key_file"`
	AuditorAdminTokenFile string `json:"auditor_admin_token_file"`
}

// LoadConfig reads a JSON config file:
//
//	{"server": "127.0.0.1:50051", "entity": "alice", "key_version": 1,
//	 "secret_hex": "..." | "secret_file": "path",
//	 "private_key_file": "key.pem", "certificate_file": "cert.pem",
//	 "admin_token_file": "token",
//	 "mode": "auditor", "auditor": "127.0.0.1:50061",
//	 "auditor_key": "<fingerprint>" | "auditor_key_file": "auditor.pem",
//	 "auditor_admin_token_file": "auditor.token"}
//
// Relative paths are relative to the file's directory.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("client: config: %w", err)
	}
	var fc fileConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		return Config{}, fmt.Errorf("client: config %s: %w", path, err)
	}
	return fc.resolve(filepath.Dir(path))
}

// ConfigFromEnv reads KIROKU_SERVER, KIROKU_ENTITY, KIROKU_KEY_VERSION,
// KIROKU_SECRET (hex) or KIROKU_SECRET_FILE, KIROKU_PRIVATE_KEY_FILE,
// KIROKU_CERT_FILE, KIROKU_ADMIN_TOKEN_FILE, KIROKU_MODE, for Validator
// mode KIROKU_VALIDATOR, and for Auditor mode KIROKU_AUDITOR, KIROKU_AUDITOR_KEY (a fingerprint) or
// KIROKU_AUDITOR_KEY_FILE, and KIROKU_AUDITOR_ADMIN_TOKEN_FILE.
func ConfigFromEnv() (Config, error) {
	fc := fileConfig{Server: os.Getenv("KIROKU_SERVER"), Entity: os.Getenv("KIROKU_ENTITY"),
		SecretHex: os.Getenv("KIROKU_SECRET"), SecretFile: os.Getenv("KIROKU_SECRET_FILE"),
		PrivateKeyFile: os.Getenv("KIROKU_PRIVATE_KEY_FILE"), CertFile: os.Getenv("KIROKU_CERT_FILE"),
		AdminTokenFile: os.Getenv("KIROKU_ADMIN_TOKEN_FILE"), Mode: os.Getenv("KIROKU_MODE"), Validator: os.Getenv("KIROKU_VALIDATOR"), Auditor: os.Getenv("KIROKU_AUDITOR"),
		AuditorKey: os.Getenv("KIROKU_AUDITOR_KEY"), AuditorKeyFile: os.Getenv("KIROKU_AUDITOR_KEY_FILE"),
		AuditorAdminTokenFile: os.Getenv("KIROKU_AUDITOR_ADMIN_TOKEN_FILE")}
	if v := os.Getenv("KIROKU_KEY_VERSION"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return Config{}, fmt.Errorf("client: KIROKU_KEY_VERSION: %w", err)
		}
		fc.KeyVersion = uint32(n)
	}
	return fc.resolve("")
}

func (fc fileConfig) resolve(dir string) (Config, error) {
	c := Config{Server: fc.Server, Entity: fc.Entity, KeyVersion: fc.KeyVersion, Mode: fc.Mode, Validator: fc.Validator, Auditor: fc.Auditor,
		AuditorKey: fc.AuditorKey}
	read := func(p string) ([]byte, error) {
		if p == "" {
			return nil, nil
		}
		if dir != "" && !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("client: config: %w", err)
		}
		return b, nil
	}
	var err error
	secretHex := fc.SecretHex
	if fc.SecretFile != "" {
		b, err := read(fc.SecretFile)
		if err != nil {
			return c, err
		}
		secretHex = strings.TrimSpace(string(b))
	}
	if secretHex != "" {
		if c.Secret, err = hex.DecodeString(secretHex); err != nil {
			return c, fmt.Errorf("client: config: secret is not hex: %w", err)
		}
	}
	if c.PrivateKeyPEM, err = read(fc.PrivateKeyFile); err != nil {
		return c, err
	}
	if c.CertificatePEM, err = read(fc.CertFile); err != nil {
		return c, err
	}
	tok, err := read(fc.AdminTokenFile)
	if err != nil {
		return c, err
	}
	c.AdminToken = strings.TrimSpace(string(tok))
	if fc.AuditorKeyFile != "" {
		if fc.AuditorKey != "" {
			return c, errors.New("client: config: auditor_key and auditor_key_file both set; pick one")
		}
		b, err := read(fc.AuditorKeyFile)
		if err != nil {
			return c, err
		}
		c.AuditorKey = string(b)
	}
	if tok, err = read(fc.AuditorAdminTokenFile); err != nil {
		return c, err
	}
	c.AuditorAdminToken = strings.TrimSpace(string(tok))
	return c, nil
}

// Client talks to a ledger server, or to the members of a cluster. It is
// safe for concurrent use.
//
// With a cluster, Config.Server lists one or more members; a member that
// does not lead answers with the leader's address, and the client sends
// that call and the next ones there. A member that cannot be reached, or
// knows no leader (an election is under way), sends the client to the
// next member of the list, for up to Config.LeaderWait.
type Client struct {
	cfg     Config
	opts    []grpc.DialOption
	servers []string
	signer  auth.Signer  // nil: the client can only read
	aud     *auditorConn // the Auditor, in Auditor mode; else nil

	mu      sync.Mutex
	cur     *target
	targets map[string]*target
	closed  bool
}

// target is one server: its connection, and the calls' stream over it.
type target struct {
	addr string
	conn *grpc.ClientConn
	api  api.LedgerClient
	mux  *mux // nil with UnaryCalls
}

// Dial connects to cfg.Server. The connection is made lazily; the first
// call reports an unreachable server.
func Dial(cfg Config) (*Client, error) {
	if cfg.Server == "" {
		cfg.Server = "127.0.0.1:50051"
	}
	if cfg.KeyVersion == 0 {
		cfg.KeyVersion = 1
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 10 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.LeaderWait <= 0 {
		cfg.LeaderWait = 10 * time.Second
	}
	c := &Client{cfg: cfg, targets: map[string]*target{}}
	for _, a := range strings.Split(cfg.Server, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(c.servers, a) {
			c.servers = append(c.servers, a)
		}
	}
	if len(c.servers) == 0 {
		return nil, fmt.Errorf("client: no server address in %q", cfg.Server)
	}
	var err error
	switch {
	case len(cfg.Secret) > 0 && len(cfg.PrivateKeyPEM) > 0:
		return nil, errors.New("client: config has both an HMAC secret and an ECDSA key; pick one")
	case len(cfg.Secret) > 0:
		c.signer, err = auth.NewHMACSigner(cfg.Secret)
	case len(cfg.PrivateKeyPEM) > 0:
		k, perr := auth.ParsePrivateKeyPEM(cfg.PrivateKeyPEM)
		if err = perr; err == nil {
			c.signer, err = auth.NewECDSASigner(k)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c.opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxReplyBytes)),
		grpc.WithStaticStreamWindowSize(api.StreamWindow), grpc.WithStaticConnWindowSize(api.ConnWindow)}, cfg.DialOptions...)
	if err := c.dialAuditor(cfg); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur, err = c.targetLocked(c.servers[0]); err != nil {
		if c.aud != nil {
			c.aud.conn.Close()
		}
		return nil, err
	}
	return c, nil
}

// targetLocked returns the target of addr, connecting to it (lazily) the
// first time.
func (c *Client) targetLocked(addr string) (*target, error) {
	if t := c.targets[addr]; t != nil {
		return t, nil
	}
	if c.closed {
		return nil, errors.New("client: closed")
	}
	conn, err := grpc.NewClient(addr, c.opts...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	t := &target{addr: addr, conn: conn, api: api.NewLedgerClient(conn)}
	if !c.cfg.UnaryCalls {
		t.mux = newMux(t.api)
	}
	c.targets[addr] = t
	return t, nil
}

// current is the server calls go to.
func (c *Client) current() *target {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// follow sends the calls to addr, the leader a member named, instead of
// from (unless another call moved them already).
func (c *Client) follow(from *target, addr string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != from {
		return nil
	}
	t, err := c.targetLocked(addr)
	if err != nil {
		return err
	}
	c.cur = t
	return nil
}

// next sends the calls to the member after from in the server list
// (unless another call moved them already); with a single server, it
// stays.
func (c *Client) next(from *target) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != from || len(c.servers) < 2 {
		return
	}
	i := slices.Index(c.servers, from.addr)
	t, err := c.targetLocked(c.servers[(i+1)%len(c.servers)])
	if err == nil {
		c.cur = t
	}
}

// Server is the address calls go to now: the server dialled, or the
// cluster member the client was last sent to.
func (c *Client) Server() string { return c.current().addr }

// Close closes the connections.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for _, t := range c.targets {
		if t.mux != nil {
			t.mux.close()
		}
		errs = append(errs, t.conn.Close())
	}
	if c.aud != nil {
		errs = append(errs, c.aud.conn.Close())
	}
	return errors.Join(errs...)
}

// Entity returns the client's entity id and key version.
func (c *Client) Entity() (string, uint32) { return c.cfg.Entity, c.cfg.KeyVersion }

// Mode is the client's mode (Config.Mode; "" is ModeDirect) and, in
// ModeValidator, the Validator database it names (Config.Validator).
func (c *Client) Mode() (mode, validator string) {
	if c.cfg.Mode == "" {
		return ModeDirect, ""
	}
	return c.cfg.Mode, c.cfg.Validator
}

func (c *Client) needSigner() error {
	if c.signer == nil {
		return errors.New("client: no identity configured (set a secret or a private key)")
	}
	if c.cfg.Entity == "" {
		return errors.New("client: no entity configured")
	}
	return nil
}

// call runs one RPC with per-attempt timeouts, retrying while the reply is
// lost (Unavailable, an attempt that timed out while ctx has time left, or
// a commit whose outcome the server does not know), and following a
// cluster member's answer that another leads (see Client).
// Every RPC of the API is safe to repeat: reads and registrations have no
// effect twice, and an execute carries its nonce.
// It returns how many times the call was sent again, and converts errors
// back into the ledger's sentinels.
func call[T any](ctx context.Context, c *Client, f func(ctx context.Context, t *target, opts ...grpc.CallOption) (T, error)) (T, int, error) {
	var zero T
	var err error
	var trailer metadata.MD
	tries, lost, hops, waits := 0, 0, 0, 0
	leaderDeadline := time.Now().Add(c.cfg.LeaderWait)
	for ; ; tries++ {
		t := c.current()
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		trailer = nil
		var out T
		out, err = f(actx, t, grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			return out, tries, nil
		}
		var ce *callError
		if errors.As(err, &ce) {
			trailer = ce.trailer()
		}
		code := status.Code(err)
		kinds := trailer.Get(wire.ErrorKindKey)
		var wait time.Duration
		switch {
		case code == codes.Unavailable && slices.Contains(kinds, wire.KindNotLeader):
			// Nothing was done. Go where the member says the leader is, or,
			// while it knows none, wait for an election.
			if l := trailer.Get(wire.LeaderKey); len(l) > 0 && l[0] != t.addr && hops < maxHops {
				hops++
				if ferr := c.follow(t, l[0]); ferr != nil {
					return zero, tries, ferr
				}
				continue
			}
			c.next(t)
			if time.Now().After(leaderDeadline) {
				return zero, tries, fromStatus(err, trailer)
			}
			waits++
			wait = time.Duration(1<<min(waits, 4)) * 25 * time.Millisecond
		default:
			// A commit whose outcome the server could not learn is a lost
			// reply too: the retry, with the same nonce, finds out.
			isLost := code == codes.Unavailable || (code == codes.DeadlineExceeded && ctx.Err() == nil) ||
				(code == codes.Unknown && slices.Contains(kinds, wire.KindCommitUnknown))
			if !isLost {
				return zero, tries, fromStatus(err, trailer)
			}
			if len(c.servers) > 1 && time.Now().Before(leaderDeadline) {
				// A member may have gone: try the next, waiting as for an
				// election.
				c.next(t)
				waits++
				wait = time.Duration(1<<min(waits, 4)) * 25 * time.Millisecond
			} else {
				if lost++; lost >= c.cfg.MaxAttempts {
					return zero, tries, fromStatus(err, nil)
				}
				wait = time.Duration(1<<min(lost, 6)) * 10 * time.Millisecond
			}
		}
		select {
		case <-ctx.Done():
			return zero, tries, errors.Join(fromStatus(err, trailer), ctx.Err())
		case <-time.After(wait):
		}
	}
}

// maxHops bounds how many times one call follows a member's word that
// another leads, against members that send it round in circles.
const maxHops = 8

// ErrConflict is the sentinel of a transaction the ledger aborted after
// conflicting with others on every attempt: nothing was committed, and the
// same request (nonce) may be sent again.
var ErrConflict = errors.New("client: the transaction kept conflicting with others; nothing was committed")

// fromStatus turns a gRPC error into one wrapping the ledger's sentinel.
func fromStatus(err error, trailer metadata.MD) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if kinds := trailer.Get(wire.ErrorKindKey); len(kinds) > 0 {
		if s := proof.KindError(kinds[0]); s == proof.ErrByzantineFault {
			// The caller knows the nonce (Validate sets it).
			return &Error{Code: st.Code(), Kind: kinds[0], Msg: st.Message(), sentinel: wire.FaultFromTrailer("", st.Message(), trailer)}
		} else if s != nil {
			return &Error{Code: st.Code(), Kind: kinds[0], Msg: st.Message(), sentinel: s}
		}
		if kinds[0] == wire.KindConflict {
			return &Error{Code: st.Code(), Kind: kinds[0], Msg: st.Message(), sentinel: ErrConflict}
		}
	}
	return &Error{Code: st.Code(), Msg: st.Message()}
}

// Error is a failed call: the gRPC code, the ledger's (or the Auditor's)
// error kind if any, and the server's message. errors.Is matches the
// sentinel of Kind: the ledger's, or ErrConflict for "conflict"; for
// "byzantine_fault", errors.As finds the *proof.ByzantineFault too.
type Error struct {
	Code     codes.Code
	Kind     string
	Msg      string
	sentinel error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the ledger sentinel.
func (e *Error) Unwrap() error { return e.sentinel }

// NewNonce returns a random UUID, the usual nonce.
func NewNonce() string { return uuid.Must(uuid.NewRandomFromReader(rand.Reader)).String() }
