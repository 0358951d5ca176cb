package validator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Errors the Validator returns besides the ledger's and the storage API's.
var (
	ErrConfig           = errors.New("validator: invalid configuration")
	ErrLedgerKeyChanged = errors.New("validator: the ledger's proof key differs from the one pinned in the Validator database")
	ErrUnverifiable     = errors.New("validator: cannot verify the ledger's proofs")
	// ErrLogIncomplete: the ledger answered, but logging its reply failed.
	// The transaction stays in doubt until Recover resolves it.
	ErrLogIncomplete = errors.New("validator: the reply could not be logged")
)

// Config configures a Validator. The Validator database and the client's
// identity belong to the Validator's domain; the ledger's operator controls
// neither.
type Config struct {
	// DB is the Validator database: an embedded engine in its own data
	// directory, or a PostgreSQL the Validator's operator runs. Any number
	// of processes may share it. Required.
	DB storage.Backend
	// Namespace holds the Validator's tables; "" means DefaultNamespace.
	Namespace string
	// Client is the SDK the Validator wraps: the requests it logs are
	// signed with this client's identity. Required.
	Client *client.Client
	// LedgerKey verifies the ledger's proofs and receipts. nil: the
	// ledger's ECDSA public key is fetched on first Open and pinned in the
	// Validator database; later Opens refuse a ledger whose key changed.
	// A ledger that signs with HMAC needs its key given here.
	LedgerKey auth.Verifier
	// Clock configures the logical clock.
	Clock ClockConfig
	// TxTimeout is the longest the ledger may take to commit or abort a
	// transaction. Recovery stamps a transaction the ledger does not know
	// as aborted only once this much time has passed since it was logged.
	// 0 means 30 s.
	TxTimeout time.Duration
	// Limits bound re-execution; they must be the ledger's. Zero fields
	// take the ledger's defaults.
	Limits ledger.Limits
	// LeaseTTL is how long a validation's lease on the Validator database
	// lasts unless renewed; a running validation renews it every
	// LeaseTTL/4, and a lease left by a validation that died is taken over
	// once it has expired. 0 means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Now is the wall clock, for the transaction timeout and lease expiry;
	// nil means time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.DB == nil {
		return c, fmt.Errorf("%w: no Validator database", ErrConfig)
	}
	if c.Client == nil {
		return c, fmt.Errorf("%w: no client", ErrConfig)
	}
	if c.TxTimeout < 0 {
		return c, fmt.Errorf("%w: negative transaction timeout", ErrConfig)
	}
	if c.LeaseTTL < 0 || c.LeaseTTL > 0 && c.LeaseTTL < time.Millisecond {
		return c, fmt.Errorf("%w: lease TTL %v; want at least 1 ms", ErrConfig, c.LeaseTTL)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	var err error
	c.Clock, err = c.Clock.withDefaults()
	return c, err
}

// Validator is the client-side library of seed 000: used in place of the
// SDK, it logs every request with a begin clock before sending it and its
// outcome with an end clock after the reply (Algorithm 1), and later
// validates what was logged (Algorithm 2). It is safe for concurrent use;
// logging takes no lock of its own.
type Validator struct {
	cfg   Config
	db    storage.Backend
	ns    string
	c     *client.Client
	clock *Clock
	key   auth.Verifier
	// outcomes is the view outcomes are logged through: the database's
	// unsynced view if it has one (see doc.go, "Durability of the log").
	outcomes storage.Ops
	// requests and stamps commit the requests, and the outcomes, that
	// concurrent callers log, grouped, on a database other processes
	// share (see doc.go, "Group commit on a shared database"); nil on an
	// exclusive one.
	requests, stamps *committer

	contracts sync.Map  // contract id → ledger.Contract
	logs      sync.Pool // spent *logRequests, for reuse
}

// Open opens the Validator database (creating its tables) and pins the
// ledger's key.
func Open(ctx context.Context, cfg Config) (*Validator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ensureSchema(ctx, cfg.DB, cfg.Namespace); err != nil {
		return nil, err
	}
	v := &Validator{cfg: cfg, db: cfg.DB, ns: cfg.Namespace, c: cfg.Client, key: cfg.LedgerKey, outcomes: storage.Unsynced(cfg.DB)}
	if v.clock, err = newClock(ctx, cfg.DB, cfg.Namespace, cfg.Clock); err != nil {
		return nil, err
	}
	if !v.clock.owned {
		v.requests, v.stamps = &committer{db: cfg.DB, clock: v.clock}, &committer{db: cfg.DB, clock: v.clock, ends: true}
	}
	if v.key == nil {
		if v.key, err = v.pinLedgerKey(ctx); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// pinLedgerKey fetches the ledger's public key, stores it on first use and
// refuses a different one later.
func (v *Validator) pinLedgerKey(ctx context.Context) (auth.Verifier, error) {
	k, err := v.c.LedgerKey(ctx)
	if err != nil {
		return nil, fmt.Errorf("validator: fetching the ledger's key: %w", err)
	}
	if k.Scheme != auth.SchemeECDSA.String() {
		return nil, fmt.Errorf("%w: the ledger signs with %s; give its key in Config.LedgerKey", ErrUnverifiable, k.Scheme)
	}
	meta := &storage.Get{Namespace: v.ns, Table: tMeta, Partition: storage.Values{"name": storage.Text("ledger_key")}}
	row, ok, err := v.db.Get(ctx, meta)
	if err != nil {
		return nil, err
	}
	pinned := k.PublicKeyPem
	if ok {
		pinned = row["value"].AsText()
	} else {
		err := v.db.Put(ctx, &storage.Put{Namespace: v.ns, Table: tMeta, Partition: meta.Partition,
			Values: storage.Values{"value": storage.Text(k.PublicKeyPem)}, Condition: storage.IfNotExists()})
		if errors.Is(err, storage.ErrConditionNotMet) {
			return v.pinLedgerKey(ctx) // another process pinned it first
		}
		if err != nil {
			return nil, err
		}
	}
	if pinned != k.PublicKeyPem {
		return nil, fmt.Errorf("%w (pinned: %q, served: %q)", ErrLedgerKeyChanged, pinned, k.PublicKeyPem)
	}
	return parsePublicKey([]byte(pinned))
}

func parsePublicKey(pemBytes []byte) (auth.Verifier, error) {
	pub, err := auth.ParsePublicKeyPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: the ledger's key: %w", ErrUnverifiable, err)
	}
	return auth.NewECDSAVerifier(pub)
}

// Execute runs contractID with a JSON argument under a fresh nonce, logging
// it as Algorithm 1 does. See ExecuteRequest.
func (v *Validator) Execute(ctx context.Context, contractID string, argument []byte) (*proof.Result, error) {
	r, err := v.c.NewRequest(contractID, argument)
	if err != nil {
		return nil, err
	}
	return v.ExecuteRequest(ctx, r)
}

// ExecuteRequest logs the request with a begin clock, sends it, and logs
// the outcome with an end clock: the receipt and proofs if it committed,
// the reason if the ledger refused or aborted it. A request whose outcome
// is unknown (the reply was lost) stays in doubt for Recover. If logging
// the outcome fails, the result is returned with an error wrapping
// ErrLogIncomplete: the transaction did commit.
//
// The request is durable before it is sent. The outcome is visible when
// ExecuteRequest returns and, on a database with an unsynced view (the
// embedded engine), durable with the next durable commit: a crash may
// lose it, and the transaction is then in doubt again and Recover finds
// its outcome at the ledger (see doc.go).
func (v *Validator) ExecuteRequest(ctx context.Context, r *proof.Request) (*proof.Result, error) {
	t := &Tx{Request: *r, LoggedAt: v.cfg.Now().UnixMicro()}
	if err := v.logRequest(ctx, t); err != nil {
		return nil, err
	}
	res, xerr := v.c.ExecuteRequest(ctx, r)
	switch {
	case xerr == nil:
		t.Status, t.Receipt, t.Proofs = StatusCommitted, res.Receipt, res.Proofs
	case definitive(xerr):
		t.Status, t.Reason = StatusAborted, xerr.Error()
	default:
		return nil, xerr // in doubt
	}
	if err := v.logOutcome(ctx, t); err != nil {
		if xerr != nil {
			return nil, errors.Join(xerr, err)
		}
		return res, err
	}
	return res, xerr
}

// definitive reports whether err is the ledger's own answer that it did not
// commit (a refusal or an abort), not a lost or ambiguous reply.
func definitive(err error) bool {
	return proof.Kind(err) != "" && !errors.Is(err, proof.ErrNonceReused) && !errors.Is(err, proof.ErrNotFound)
}

// logRequests returns requests to log a transaction with, spent ones if
// there are; put them back in v.logs once done.
func (v *Validator) logRequests() *logRequests {
	if lr, ok := v.logs.Get().(*logRequests); ok {
		return lr
	}
	return newLogRequests(v.ns)
}

func (v *Validator) logRequest(ctx context.Context, t *Tx) error {
	lr := v.logRequests()
	defer v.logs.Put(lr)
	var err error
	if v.requests != nil {
		// The request committer takes the begin clock (see doc.go, "Group
		// commit on a shared database").
		t.Begin, err = v.requests.do(ctx, lr.requestPut(t), lr.pendingPut(t))
	} else if t.Begin, err = v.clock.Begin(ctx); err == nil {
		err = commitPuts(ctx, v.db, lr.requestPut(t), lr.pendingPut(t))
	}
	if errors.Is(err, storage.ErrConditionNotMet) {
		return fmt.Errorf("%w: nonce %s is already logged", proof.ErrNonceReused, t.Request.Nonce)
	}
	if err != nil {
		return fmt.Errorf("validator: logging request %s: %w", t.Request.Nonce, err)
	}
	return nil
}

// logOutcome takes the end clock and stamps it with the outcome, unless
// another process (Recover) stamped the transaction first.
//
// On a shared database the stamp committer takes the end clock, in the
// transaction that stamps the outcome (see doc.go, "Group commit on a
// shared database").
func (v *Validator) logOutcome(ctx context.Context, t *Tx) error {
	var err error
	lr := v.logRequests()
	if v.stamps != nil {
		t.End, err = v.stamps.do(ctx, lr.outcomePut(t))
	} else if t.End, err = v.clock.End(ctx); err == nil {
		err = v.outcomes.Put(ctx, lr.outcomePut(t))
	}
	v.logs.Put(lr)
	if !errors.Is(err, storage.ErrConditionNotMet) {
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrLogIncomplete, t.Request.Nonce, err)
		}
		return nil
	}
	// Recover stamped it first. That is fine if it found the same outcome;
	// if it gave up on the transaction (the timeout) and the reply says
	// otherwise, the log contradicts what the caller is told.
	got, _, err := v.db.Get(ctx, &storage.Get{Namespace: v.ns, Table: tTxs, Partition: storage.Values{"nonce": storage.Text(t.Request.Nonce)},
		Projection: []string{"status"}})
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrLogIncomplete, t.Request.Nonce, err)
	}
	if st := Status(got["status"].AsText()); st != t.Status {
		return fmt.Errorf("%w: %s was logged as %s by recovery before its reply (%s) arrived", ErrLogIncomplete, t.Request.Nonce, st, t.Status)
	}
	return nil
}

// RegisterContract registers Starlark source with the ledger through the
// wrapped client, and keeps the Validator's own copy for re-execution.
func (v *Validator) RegisterContract(ctx context.Context, id string, source []byte) error {
	if err := v.c.RegisterContract(ctx, id, source); err != nil {
		return err
	}
	return v.db.Put(ctx, &storage.Put{Namespace: v.ns, Table: tMeta, Partition: storage.Values{"name": storage.Text("contract/" + id)},
		Values: storage.Values{"value": storage.Text(string(source))}})
}

// contract returns the compiled contract id for re-execution: a built-in,
// the Validator's own copy, or else the source the ledger lists (whose
// registration the ledger checked against the registering client's
// signature; a contract registered through another Validator database is
// only as trustworthy as that).
func (v *Validator) contract(ctx context.Context, id string) (ledger.Contract, error) {
	if c, ok := ledger.Builtins[id]; ok {
		return c, nil
	}
	if c, ok := v.contracts.Load(id); ok {
		return c.(ledger.Contract), nil
	}
	var source []byte
	row, ok, err := v.db.Get(ctx, &storage.Get{Namespace: v.ns, Table: tMeta, Partition: storage.Values{"name": storage.Text("contract/" + id)}})
	if err != nil {
		return nil, err
	}
	if ok {
		source = []byte(row["value"].AsText())
	} else {
		cs, err := v.c.ListContracts(ctx)
		if err != nil {
			return nil, err
		}
		for _, info := range cs {
			if info.ContractId == id && !info.Builtin {
				source = info.Source
			}
		}
		if source == nil {
			return nil, fmt.Errorf("%w: %s", proof.ErrUnknownContract, id)
		}
	}
	c, err := ledger.CompileContract(id, source)
	if err != nil {
		return nil, err
	}
	v.contracts.Store(id, c)
	return c, nil
}

// scanRows reads a whole partition range outside a transaction. The
// backends retry a scan's start; a retryable failure while its rows
// stream (PostgreSQL's SERIALIZABLE can fail even a lone read) is retried
// here, from the start.
func (v *Validator) scanRows(ctx context.Context, s *storage.Scan) ([]storage.Row, error) {
	var all []storage.Row
	err := retry(ctx, func() error {
		rows, err := v.db.Scan(ctx, s)
		if err != nil {
			return err
		}
		all, err = storage.CollectRows(rows)
		return err
	})
	return all, err
}
