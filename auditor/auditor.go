package auditor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Config configures an Auditor.
type Config struct {
	// Replica is the Auditor's own ledger, on its own database: the
	// identities and contracts enrolled with the Auditor, and the versions
	// it validated. Nothing else may write to it.
	Replica *ledger.Ledger
	// DB is the Replica's database: the Auditor keeps its orders there
	// too, in Namespace ("" means "auditor"), so that a restart finds the
	// requests it ordered and did not settle.
	DB        storage.Backend
	Namespace string
	// Signer is the Auditor's key: it signs order tokens and approvals.
	Signer auth.Signer
	// LedgerKey verifies the ledger's proofs and receipts.
	LedgerKey auth.Verifier
	// Ledger is how the Auditor asks the ledger about a request whose
	// lease ran out (recovery).
	Ledger LedgerView
	// Lease is how long a request holds its locks between Ordering and
	// Validation before the Auditor settles it itself; 0 means 10s.
	Lease time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// LedgerView is what recovery asks of the ledger.
type LedgerView interface {
	// TxState is the state the ledger recorded for nonce.
	TxState(ctx context.Context, nonce string) (*proof.TxState, error)
	// Version is version age of asset id, with its proof signature.
	Version(ctx context.Context, id string, age int64) (*proof.Version, error)
	// AbortNonce records nonce as aborted unless it has a state, and
	// returns its state.
	AbortNonce(ctx context.Context, nonce, reason string) (*proof.TxState, error)
}

// ErrByzantineFault is the cause of every ByzantineFault
// (proof.ErrByzantineFault, kind byzantine_fault on the wire).
var ErrByzantineFault = proof.ErrByzantineFault

// ErrNotOrdered is the error of a validation of a request the Auditor has
// no order for (never ordered, or settled and not validated); kind
// not_ordered (proof.ErrNotOrdered).
var ErrNotOrdered = proof.ErrNotOrdered

// ByzantineFault is a disagreement between the ledger and the Auditor
// about one transaction: which asset and version, and which check failed.
// It is proof's, so that the SDK, which does not link the ledger, returns
// the same type.
type ByzantineFault = proof.ByzantineFault

// Auditor orders and validates requests (see the package doc).
type Auditor struct {
	cfg   Config
	locks *lockTable
	mu    sync.Mutex
	order map[string]*order
}

// order is a request between its Ordering and its Validation: what the
// Auditor's run of it read, wrote and returned, and the token it gave.
type order struct {
	req      *proof.Request
	digest   []byte
	run      *ledger.Run
	versions []*ledger.Version // what the ledger must commit, unsigned
	token    *proof.OrderToken
	// settling is held by whoever settles the order — a Validate, or
	// recovery once the lease ran out — so that the two never settle it
	// at once; the second finds it settled (current).
	settling sync.Mutex
}

// Open returns an Auditor. It creates its orders table if missing, and
// takes up the requests it ordered before a restart and did not settle:
// each holds its locks again until its validation, or its recovery once
// the token's deadline passed.
func Open(ctx context.Context, cfg Config) (*Auditor, error) {
	if cfg.Replica == nil || cfg.DB == nil || cfg.Signer == nil || cfg.LedgerKey == nil {
		return nil, errors.New("auditor: Config needs Replica, DB, Signer and LedgerKey")
	}
	if cfg.Lease == 0 {
		cfg.Lease = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "auditor"
	}
	a := &Auditor{cfg: cfg, locks: newLockTable(cfg.Now), order: map[string]*order{}}
	if err := storage.EnsureTables(ctx, cfg.DB, cfg.Namespace, []*storage.Table{ordersTable(cfg.Namespace)}); err != nil {
		return nil, fmt.Errorf("auditor: %w", err)
	}
	if err := a.reload(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// maxOrderRuns bounds the runs of one Ordering: a request whose assets
// change between its run and its locks is run again, and one that keeps
// touching other assets than its locks cover is refused as overloaded.
const maxOrderRuns = 8

// Order verifies req, runs it on the replica to learn the assets it reads
// and writes, locks them and returns a signed token. Ordering the same
// request again while it is ordered returns its token; another request
// with an ordered or recorded nonce is ErrNonceReused. A contract that
// fails on the replica fails here, with the ledger's error: the ledger
// would fail it the same way.
func (a *Auditor) Order(ctx context.Context, req *proof.Request) (*proof.OrderToken, error) {
	rep := a.cfg.Replica
	if err := rep.VerifyRequest(ctx, req); err != nil {
		return nil, err
	}
	digest := proof.RequestDigest(req)
	a.mu.Lock()
	if o := a.order[req.Nonce]; o != nil {
		a.mu.Unlock()
		if bytes.Equal(o.digest, digest) {
			return o.token, nil
		}
		return nil, fmt.Errorf("%w: %s is ordered for another request", ledger.ErrNonceReused, req.Nonce)
	}
	a.mu.Unlock()
	if st, err := rep.TxState(ctx, req.Nonce); err != nil {
		return nil, err
	} else if st.Status != ledger.TxUnknown {
		return nil, fmt.Errorf("%w: %s", ledger.ErrNonceReused, req.Nonce)
	}
	load := rep.Loader(ctx)
	src := rep.Source()
	run, err := ledger.RunContract(ctx, rep.Limits(), load, src, req.ContractID, req.Argument)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		reads, writes := slices.Collect(maps.Keys(run.Input)), slices.Collect(maps.Keys(run.Writes))
		if err := a.locks.acquire(ctx, req.Nonce, reads, writes, a.cfg.Lease); err != nil {
			var dup *errLocked
			if errors.As(err, &dup) {
				return nil, fmt.Errorf("%w: %s is being ordered", ledger.ErrNonceReused, req.Nonce)
			}
			return nil, err
		}
		// The run stands if no head it saw moved while the locks were
		// taken: what it read is immutable below the heads.
		same, err := a.headsUnchanged(ctx, run)
		if err != nil {
			a.locks.release(req.Nonce)
			return nil, err
		}
		if same {
			break
		}
		again, err := ledger.RunContract(ctx, rep.Limits(), load, src, req.ContractID, req.Argument)
		if err != nil {
			a.locks.release(req.Nonce)
			return nil, err
		}
		if covered(again, reads, writes) {
			run = again
			break
		}
		a.locks.release(req.Nonce)
		if attempt == maxOrderRuns {
			return nil, fmt.Errorf("%w: the request's assets kept changing while it was ordered", ledger.ErrOverloaded)
		}
		run = again
	}
	tok := &proof.OrderToken{Nonce: req.Nonce, Digest: digest, Deadline: a.cfg.Now().Add(a.cfg.Lease).UnixMilli()}
	sig, err := proof.Sign(a.cfg.Signer, tok)
	if err != nil {
		a.locks.release(req.Nonce)
		return nil, err
	}
	tok.Signature = sig
	o := &order{req: req, digest: digest, run: run, versions: ledger.NewVersions(req, run), token: tok}
	// Durable before the token leaves: a restarted Auditor must still
	// hold the locks of every request that may run on the ledger.
	if err := a.cfg.DB.Put(ctx, orderPut(a.cfg.Namespace, o)); err != nil {
		a.locks.release(req.Nonce)
		return nil, fmt.Errorf("auditor: recording the order of %s: %w", req.Nonce, err)
	}
	a.mu.Lock()
	a.order[req.Nonce] = o
	a.mu.Unlock()
	return tok, nil
}

// headsUnchanged reports whether every head run saw is still the replica's.
func (a *Auditor) headsUnchanged(ctx context.Context, run *ledger.Run) (bool, error) {
	src := a.cfg.Replica.Source()
	for id, h := range run.Heads {
		now, err := src.Head(ctx, id)
		if err != nil {
			return false, err
		}
		if now.Age != h.Age {
			return false, nil
		}
	}
	return true, nil
}

// covered reports whether run touched only assets the locks cover, each
// written one under an exclusive lock.
func covered(run *ledger.Run, reads, writes []string) bool {
	for id := range run.Writes {
		if !slices.Contains(writes, id) {
			return false
		}
	}
	for id := range run.Input {
		if !slices.Contains(reads, id) && !slices.Contains(writes, id) {
			return false
		}
	}
	return true
}

// Validate checks what the ledger returned for an ordered request against
// the Auditor's own run: the ledger's signatures, the result, the ages
// read, and each version written (asset, age, input and hash, chained from
// the replica's). If they agree, it appends the versions to the replica,
// releases the request's locks and returns its approval of the receipt.
// If they do not, the error is a *ByzantineFault; the locks are released
// and the replica keeps the history both domains signed.
//
// A request the Auditor has no order for is ErrNotOrdered, unless its
// transaction is in the replica with exactly res's receipt: validated
// already — by recovery, or by a Validate whose reply the client lost —
// it is approved again.
func (a *Auditor) Validate(ctx context.Context, req *proof.Request, res *proof.Result) (*proof.Approval, error) {
	a.mu.Lock()
	o := a.order[req.Nonce]
	a.mu.Unlock()
	if o == nil || !bytes.Equal(o.digest, proof.RequestDigest(req)) {
		return a.validated(ctx, req, res)
	}
	o.settling.Lock()
	defer o.settling.Unlock()
	if !a.current(o) {
		return a.validated(ctx, req, res) // recovery settled it meanwhile
	}
	return a.settle(ctx, o, res)
}

// current reports whether o is still ordered, not settled.
func (a *Auditor) current(o *order) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.order[o.req.Nonce] == o
}

// validated approves res again if its transaction is in the replica with
// exactly its receipt; else ErrNotOrdered.
func (a *Auditor) validated(ctx context.Context, req *proof.Request, res *proof.Result) (*proof.Approval, error) {
	st, err := a.cfg.Replica.TxState(ctx, req.Nonce)
	if err != nil {
		return nil, err
	}
	if st.Status == ledger.TxCommitted && st.Contract == req.ContractID {
		if rc := st.Receipt(); bytes.Equal(proof.ReceiptDigest(&rc), proof.ReceiptDigest(&res.Receipt)) {
			return a.approve(&rc)
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNotOrdered, req.Nonce)
}

// approve countersigns receipt rc.
func (a *Auditor) approve(rc *proof.Receipt) (*proof.Approval, error) {
	ap := &proof.Approval{Nonce: rc.Nonce, Digest: proof.ReceiptDigest(rc)}
	sig, err := proof.Sign(a.cfg.Signer, ap)
	if err != nil {
		return nil, err
	}
	ap.Signature = sig
	return ap, nil
}

// settle validates o against res and ends the order either way, unless
// the replica itself failed (then it stays ordered, to be settled again).
func (a *Auditor) settle(ctx context.Context, o *order, res *proof.Result) (*proof.Approval, error) {
	if err := a.signedByLedger(o, res); err != nil {
		return nil, err
	}
	fault := a.check(o, res)
	if fault == nil {
		st := &ledger.TxState{Nonce: o.req.Nonce, Status: ledger.TxCommitted, Contract: o.req.ContractID, Result: res.Result,
			Writes: res.Writes, Input: res.Input, Signature: res.Signature}
		vs := make([]*ledger.Version, len(o.versions))
		for i, v := range o.versions {
			c := *v
			c.ProofSignature = res.Proofs[i].Signature
			vs[i] = &c
		}
		if err := a.cfg.Replica.Append(ctx, st, vs); err != nil {
			return nil, fmt.Errorf("auditor: recording %s: %w", o.req.Nonce, err)
		}
	}
	if err := a.forget(ctx, o); err != nil {
		return nil, err
	}
	if fault != nil {
		return nil, fault
	}
	return a.approve(&res.Receipt)
}

// signedByLedger checks that res is the ledger's word about o's request:
// a receipt for its nonce and proofs, each signed with the ledger's key.
// What fails this proves nothing about the ledger — anyone can send
// bytes that do not verify, or a receipt of another transaction — so it
// is refused (ErrBadSignature, ErrBadRequest) and the order stands, to
// be validated with the ledger's real reply or settled by recovery.
func (a *Auditor) signedByLedger(o *order, res *proof.Result) error {
	if res.Nonce != o.req.Nonce {
		return fmt.Errorf("%w: the reply is the receipt of transaction %q, not of %s", ledger.ErrBadRequest, res.Nonce, o.req.Nonce)
	}
	if err := proof.Verify(a.cfg.LedgerKey, &res.Receipt, res.Signature); err != nil {
		return fmt.Errorf("auditor: the receipt of %s is not the ledger's: %w", o.req.Nonce, err)
	}
	for i := range res.Proofs {
		p := &res.Proofs[i]
		if err := proof.Verify(a.cfg.LedgerKey, p, p.Signature); err != nil {
			return fmt.Errorf("auditor: the proof of %s@%d is not the ledger's: %w", p.ID, p.Age, err)
		}
	}
	return nil
}

// check compares the ledger's signed result (signedByLedger) with the
// Auditor's run: a difference is the ledger's fault, for it signed it.
func (a *Auditor) check(o *order, res *proof.Result) *ByzantineFault {
	f := func(asset string, age int64, check, format string, args ...any) *ByzantineFault {
		return &ByzantineFault{Nonce: o.req.Nonce, Asset: asset, Age: age, Check: check, Detail: fmt.Sprintf(format, args...)}
	}
	if res.Contract != o.req.ContractID {
		return f("", 0, "receipt", "the receipt names contract %s, the request %s", res.Contract, o.req.ContractID)
	}
	if !bytes.Equal(res.Result, o.run.Result) {
		return f("", 0, "result", "the ledger returned %s, the Auditor's run %s", res.Result, o.run.Result)
	}
	for id, age := range o.run.Input {
		if got, ok := res.Input[id]; !ok || got != age {
			return f(id, age, "input", "the Auditor's run read %s@%d, the ledger's receipt says %v", id, age, describe(res.Input, id))
		}
	}
	if len(res.Input) != len(o.run.Input) {
		return f("", 0, "input", "the ledger read %d assets, the Auditor's run %d", len(res.Input), len(o.run.Input))
	}
	if len(res.Proofs) != len(o.versions) || len(res.Writes) != len(o.versions) {
		return f("", 0, "writes", "the ledger wrote %d versions (%d proofs), the Auditor's run %d", len(res.Writes), len(res.Proofs), len(o.versions))
	}
	for i, v := range o.versions {
		p := res.Proofs[i]
		switch {
		case p.ID != v.ID || p.Age != v.Age || res.Writes[v.ID] != v.Age:
			return f(v.ID, v.Age, "version", "the ledger wrote %s@%d, the Auditor's run %s@%d", p.ID, p.Age, v.ID, v.Age)
		case !bytes.Equal(p.Hash, v.Hash):
			return f(v.ID, v.Age, "hash", "the ledger's version hashes to %x, the Auditor's to %x", p.Hash, v.Hash)
		case !maps.Equal(p.Input, v.Input) || p.Nonce != v.Nonce:
			return f(v.ID, v.Age, "version", "the proof names another transaction or read set")
		}
	}
	return nil
}

func describe(m map[string]int64, id string) string {
	if a, ok := m[id]; ok {
		return fmt.Sprintf("%s@%d", id, a)
	}
	return "no read of it"
}

// Recover settles every request whose lease ran out, as the package doc
// says: it validates what the ledger committed, or has the ledger abort
// the nonce, and only then releases the locks. It returns how many it
// settled; a request it cannot settle now (the ledger unreachable) keeps
// its locks and is tried on the next call. Faults found are returned
// joined.
func (a *Auditor) Recover(ctx context.Context) (int, error) {
	if a.cfg.Ledger == nil {
		return 0, errors.New("auditor: no Ledger to recover with")
	}
	var errs []error
	n := 0
	for _, nonce := range a.locks.expired() {
		a.mu.Lock()
		o := a.order[nonce]
		a.mu.Unlock()
		if o == nil {
			continue
		}
		if err := a.recoverOne(ctx, o); err != nil {
			errs = append(errs, err)
			if !errors.Is(err, ErrByzantineFault) {
				continue
			}
		}
		n++
	}
	return n, errors.Join(errs...)
}

func (a *Auditor) recoverOne(ctx context.Context, o *order) error {
	o.settling.Lock()
	defer o.settling.Unlock()
	if !a.current(o) {
		return nil // validated meanwhile
	}
	st, err := a.cfg.Ledger.AbortNonce(ctx, o.req.Nonce, "its order's lease ran out before it was validated")
	if err != nil {
		return fmt.Errorf("auditor: recovering %s: %w", o.req.Nonce, err)
	}
	if st.Status != ledger.TxCommitted {
		// It can no longer run: the next request may have its assets.
		return a.forget(ctx, o)
	}
	res := &proof.Result{Receipt: st.Receipt()}
	for _, id := range slices.Sorted(maps.Keys(st.Writes)) {
		v, err := a.cfg.Ledger.Version(ctx, id, st.Writes[id])
		if err != nil {
			return fmt.Errorf("auditor: recovering %s: %w", o.req.Nonce, err)
		}
		res.Proofs = append(res.Proofs, v.Proof())
	}
	_, err = a.settle(ctx, o, res)
	return err
}

// Pending is the number of requests ordered and not yet settled.
func (a *Auditor) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.order)
}

// forget ends a settled order: its row, then its locks.
func (a *Auditor) forget(ctx context.Context, o *order) error {
	if err := a.cfg.DB.Delete(ctx, orderDelete(a.cfg.Namespace, o.req.Nonce)); err != nil {
		return fmt.Errorf("auditor: settling %s: %w", o.req.Nonce, err)
	}
	a.mu.Lock()
	delete(a.order, o.req.Nonce)
	a.mu.Unlock()
	a.locks.release(o.req.Nonce)
	return nil
}
