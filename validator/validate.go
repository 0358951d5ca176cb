package validator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/mvsg"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Scope selects what a validation reports. Every run first validates all
// that was logged since the last run (the checkpoint); the scope then
// picks the violations to report, among those found now and earlier, and
// the keys to cross-check against the ledger's history.
type Scope struct {
	// Key, with Age ≥ 0, selects one version; with Age < 0, every version
	// of the key.
	Key string
	Age int64
	// KeyStart and KeyEnd select the keys in [KeyStart, KeyEnd) (an empty
	// KeyEnd: no upper bound). Ignored when Key is set.
	KeyStart, KeyEnd string
	// Nonce selects one transaction.
	Nonce string
	// CrossCheck compares the ledger's history of the keys in scope (the
	// keys this run validated, when the scope is everything) with the log.
	CrossCheck bool
	// All widens the cross-check of an everything scope to every key ever
	// logged, not only those the transactions new to this run wrote: it
	// catches a history altered after an earlier run validated it. It
	// costs one read of the ledger's whole history of each logged key.
	All bool
}

func (s Scope) everything() bool {
	return s.Key == "" && s.KeyStart == "" && s.KeyEnd == "" && s.Nonce == ""
}

// describe says, for people, which keys the run cross-checked with the
// ledger's history and what it left out.
func (s Scope) describe() string {
	switch {
	case !s.CrossCheck:
		return "no cross-check with the ledger's history"
	case s.Key != "":
		return fmt.Sprintf("cross-checked the ledger's history of %s", s.Key)
	case s.Nonce != "":
		return fmt.Sprintf("cross-checked the ledger's history of the assets %s wrote", s.Nonce)
	case s.KeyStart != "" || s.KeyEnd != "":
		return fmt.Sprintf("cross-checked the ledger's history of the logged assets in [%q, %q)", s.KeyStart, s.KeyEnd)
	case s.All:
		return "cross-checked the ledger's current history of every asset ever logged"
	}
	return "cross-checked the ledger's history of the assets written by transactions new to this run only; " +
		"assets validated by earlier runs were not re-checked (--all re-checks every logged asset: one read of its whole history each)"
}

// Validate runs the validation phase (Algorithm 2) over every transaction
// logged and not yet validated, then reports the violations in scope.
//
// In order: Recover resolves in-doubt transactions. Pending transactions
// that ended before every still-unresolved one began are validated now; the
// rest wait. Each committed one gets its receipt and proofs verified and is
// re-executed on the Validator's own states (the I/O check), in reads-from
// order; its recomputed states are stored. The MVSG over the new
// transactions, the validated ones whose clock intervals overlap them, and
// every transaction that shares a version with them is checked for cycles,
// for duplicate versions, and for dependencies that run against real time
// (stale reads). Then the new transactions are marked validated: later runs
// never repeat their work. doc.go argues why this window is enough.
//
// An error before the run's findings are stored returns a nil Report; one
// after (a failed cross-check, say) returns the Report so far beside it,
// whose violations a caller must not drop: later runs report only what
// they find themselves.
//
// Only one validation runs at a time on a Validator database: Validate
// takes a lease there (see Config.LeaseTTL) and returns ErrValidationRunning while
// another holds it.
func (v *Validator) Validate(ctx context.Context, scope Scope) (_ *Report, err error) {
	l, ctx, err := v.acquireLease(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrLeaseLost) && !errors.Is(err, ErrLeaseLost) {
			err = fmt.Errorf("%w (%w)", cause, err)
		}
		if rerr := l.release(ctx); err == nil && rerr != nil {
			err = rerr
		}
	}()
	rep := &Report{}
	began := time.Now()
	lap := func(into *float64) {
		now := time.Now()
		*into = now.Sub(began).Seconds()
		began = now
	}
	defer func(start time.Time) { rep.Seconds.Total = time.Since(start).Seconds() }(began)
	// Everything that ended before horizon is in the pending scan that
	// follows, with its outcome: a transaction logged after the scan passed
	// its bucket ended later, and so did whatever read its writes (its end
	// scan saw at least horizon).
	horizon, pending, err := v.scanPending(ctx)
	if err != nil {
		return nil, err
	}
	lap(&rep.Seconds.Load)
	if rep.Recovery, err = v.recover(ctx, pending); err != nil {
		return nil, err
	}
	if rep.Recovery.Committed+rep.Recovery.Aborted+rep.Recovery.TimedOut > 0 {
		// The stamps just made lie beyond horizon: scan again, so the
		// recovered transactions are validated in this run.
		if horizon, pending, err = v.scanPending(ctx); err != nil {
			return nil, err
		}
	}
	lap(&rep.Seconds.Recover)
	cut := horizon + 1
	for _, t := range pending {
		if t.unresolved() {
			rep.Unresolved++
			cut = min(cut, t.Begin)
		}
	}
	r := &run{v: v, ctx: ctx, rep: rep, states: map[verKey]state{}, byNonce: map[string]*mvsg.Txn{}, lap: lap}
	held := map[verKey]bool{} // versions written by transactions that wait
	for _, t := range pending {
		switch {
		case t.unresolved():
		case t.End >= cut:
			rep.Waiting++
			for k, a := range t.Receipt.Writes {
				held[verKey{k, a}] = true
			}
		case t.Status == StatusCommitted:
			r.focus = append(r.focus, t)
		default:
			r.aborted = append(r.aborted, t)
		}
	}
	// A transaction that read a version whose writer waits must wait too
	// (the writer's reply can be logged after the reader's), and so must
	// its own readers.
	for changed := len(held) > 0; changed; {
		changed = false
		r.focus = slices.DeleteFunc(r.focus, func(t *Tx) bool {
			for k, a := range t.Receipt.Input {
				if held[verKey{k, a}] {
					for k, a := range t.Receipt.Writes {
						held[verKey{k, a}] = true
					}
					rep.Waiting++
					changed = true
					return true
				}
			}
			return false
		})
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	if err := r.persist(l.fence); err != nil {
		return nil, err
	}
	lap(&rep.Seconds.Persist)
	// From here on the run's findings are stored and its transactions
	// marked validated, so no later unscoped run reports them again: a
	// failure returns the report so far with the error.
	rep.Scope = "cross-check not finished"
	if !scope.everything() {
		stored, err := v.storedViolations(ctx, scope)
		if err != nil {
			return rep, err
		}
		rep.Violations = stored
	}
	if scope.CrossCheck {
		keys, err := r.scopeKeys(scope)
		if err != nil {
			return rep, err
		}
		if err := r.crossCheck(keys); err != nil {
			return rep, err
		}
		rep.CrossCheckedKeys = len(keys)
		lap(&rep.Seconds.CrossCheck)
	}
	rep.Scope = scope.describe()
	return rep, nil
}

type verKey struct {
	id  string
	age int64
}

// state is the Validator's own copy of a version.
type state struct {
	output []byte
	hash   []byte
	nonce  string // the transaction that wrote it
}

// run is one validation.
type run struct {
	v       *Validator
	ctx     context.Context
	rep     *Report
	focus   []*Tx // committed, being validated now
	aborted []*Tx // resolved as aborted, being retired now
	states  map[verKey]state
	byNonce map[string]*mvsg.Txn
	found   []Violation // found in this run, stored by persist
	mu      sync.Mutex
	lap     func(*float64)
}

func (r *run) violation(vl Violation) {
	r.mu.Lock()
	r.found = append(r.found, vl)
	r.mu.Unlock()
}

func (r *run) validate() error {
	r.rep.Committed, r.rep.Aborted = len(r.focus), len(r.aborted)
	r.rep.Validated = len(r.focus) + len(r.aborted)
	if len(r.focus) == 0 {
		return nil
	}
	r.checkSignatures()
	r.lap(&r.rep.Seconds.Signatures)
	if err := r.checkIO(); err != nil {
		return err
	}
	r.lap(&r.rep.Seconds.IO)
	defer r.lap(&r.rep.Seconds.Graph)
	nodes, err := r.graphNodes()
	if err != nil {
		return err
	}
	g := mvsg.Build(nodes)
	r.rep.GraphNodes, r.rep.GraphEdges = g.Size()
	for _, a := range g.Anomalies() {
		r.violation(Violation{Kind: Kind(a.Kind), Txs: a.Txs, Key: a.Key, Age: a.Age, Edges: a.Edges, Detail: a.Detail})
	}
	r.rep.Violations = append(r.rep.Violations, r.found...)
	return nil
}

// checkSignatures verifies each new transaction's receipt and proofs, in
// parallel: the receipt must verify, name this nonce and contract, and the
// proofs must be one per write, for this nonce and read set, each
// verifying.
func (r *run) checkSignatures() {
	work := make(chan *Tx)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				if d := r.signatureFault(t); d != "" {
					k, a := t.firstKey()
					r.violation(Violation{Kind: KindBadSignature, Txs: []string{t.Request.Nonce}, Key: k, Age: a, Detail: d})
				}
			}
		}()
	}
	for _, t := range r.focus {
		work <- t
	}
	close(work)
	wg.Wait()
}

func (r *run) signatureFault(t *Tx) string {
	rc := &t.Receipt
	if rc.Nonce != t.Request.Nonce || rc.Contract != t.Request.ContractID {
		return fmt.Sprintf("the receipt is for %s/%s, the request was %s/%s", rc.Nonce, rc.Contract, t.Request.Nonce, t.Request.ContractID)
	}
	if err := proof.Verify(r.v.key, rc, rc.Signature); err != nil {
		return "receipt: " + err.Error()
	}
	if len(t.Proofs) != len(rc.Writes) {
		return fmt.Sprintf("%d proofs for %d writes", len(t.Proofs), len(rc.Writes))
	}
	for i := range t.Proofs {
		p := &t.Proofs[i]
		if a, ok := rc.Writes[p.ID]; !ok || a != p.Age || p.Nonce != rc.Nonce || !maps.Equal(p.Input, rc.Input) {
			return fmt.Sprintf("the proof of %s@%d does not match the receipt", p.ID, p.Age)
		}
		if err := proof.Verify(r.v.key, p, p.Signature); err != nil {
			return fmt.Sprintf("proof of %s@%d: %v", p.ID, p.Age, err)
		}
	}
	return ""
}

// checkIO re-executes the new transactions in reads-from order (Kahn's
// algorithm over the versions they wrote and read), each on the Validator's
// own states, and compares with what the ledger committed.
func (r *run) checkIO() error {
	writer := map[verKey]int{}
	for i, t := range r.focus {
		for k, a := range t.Receipt.Writes {
			writer[verKey{k, a}] = i
		}
	}
	indeg := make([]int, len(r.focus))
	next := make([][]int, len(r.focus))
	for i, t := range r.focus {
		for k, a := range t.Receipt.Input {
			if w, ok := writer[verKey{k, a}]; ok && w != i {
				indeg[i]++
				next[w] = append(next[w], i)
			}
		}
	}
	var ready []int
	for i := range r.focus {
		if indeg[i] == 0 {
			ready = append(ready, i)
		}
	}
	done := 0
	for len(ready) > 0 {
		i := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		if err := r.checkOne(r.focus[i]); err != nil {
			return err
		}
		done++
		for _, j := range next[i] {
			if indeg[j]--; indeg[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	if done < len(r.focus) {
		// A reads-from cycle: each reads what another wrote. The MVSG
		// reports it; re-execute the rest in any order.
		for i, d := range indeg {
			if d > 0 {
				if err := r.checkOne(r.focus[i]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Output serves a re-execution from the Validator's recomputed states.
func (r *run) Output(ctx context.Context, id string, age int64) ([]byte, error) {
	s, ok, err := r.state(id, age)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: the Validator has no state for %s@%d (its writer is not logged, or failed validation)", proof.ErrNotFound, id, age)
	}
	return s.output, nil
}

func (r *run) state(id string, age int64) (state, bool, error) {
	if s, ok := r.states[verKey{id, age}]; ok {
		return s, true, nil
	}
	row, ok, err := r.v.db.Get(r.ctx, &storage.Get{Namespace: r.v.ns, Table: tStates, Partition: storage.Values{"id": storage.Text(id)},
		Clustering: storage.Values{"age": storage.BigInt(age)}})
	if err != nil || !ok {
		return state{}, false, err
	}
	return state{output: []byte(row["output"].AsText()), hash: row["hash"].AsBlob(), nonce: row["nonce"].AsText()}, true, nil
}

func (r *run) checkOne(t *Tx) error {
	rc := &t.Receipt
	n := t.Request.Nonce
	load := func(id string) (ledger.Contract, error) { return r.v.contract(r.ctx, id) }
	res, div, err := ledger.Replay(r.ctx, r.v.cfg.Limits, load, t.Request.ContractID, t.Request.Argument, rc.Input, rc.Writes, r)
	if err != nil {
		return fmt.Errorf("validator: re-executing %s: %w", n, err)
	}
	k, a := t.firstKey()
	if div != "" {
		r.violation(Violation{Kind: KindIODivergence, Txs: []string{n}, Key: k, Age: a, Detail: div})
		return nil
	}
	if !bytes.Equal(res.Result, rc.Result) {
		r.violation(Violation{Kind: KindIODivergence, Txs: []string{n}, Key: k, Age: a,
			Detail: fmt.Sprintf("the ledger returned %s, re-execution gives %s", clip(rc.Result), clip(res.Result))})
	}
	for i := range t.Proofs {
		p := &t.Proofs[i]
		ver := &proof.Version{ID: p.ID, Age: p.Age, Input: rc.Input, Output: res.Writes[p.ID], Contract: t.Request.ContractID,
			Argument: t.Request.Argument, Nonce: n, Entity: t.Request.Entity, KeyVersion: t.Request.KeyVersion,
			Signature: t.Request.Signature, PrevHash: p.PrevHash}
		h := ver.ComputeHash()
		if !bytes.Equal(h, p.Hash) {
			r.violation(Violation{Kind: KindIODivergence, Txs: []string{n}, Key: p.ID, Age: p.Age,
				Detail: fmt.Sprintf("the proof's hash %x is not that of the re-executed version (%x): another output", p.Hash, h)})
		}
		if p.Age == 0 && len(p.PrevHash) != 0 {
			r.violation(Violation{Kind: KindIODivergence, Txs: []string{n}, Key: p.ID, Age: p.Age, Detail: "a first version with a prev_hash"})
		} else if p.Age > 0 {
			prev, ok, err := r.state(p.ID, p.Age-1)
			if err != nil {
				return err
			}
			if ok && !bytes.Equal(prev.hash, p.PrevHash) {
				r.violation(Violation{Kind: KindIODivergence, Txs: []string{n}, Key: p.ID, Age: p.Age,
					Detail: fmt.Sprintf("prev_hash %x is not the hash of %s@%d (%x)", p.PrevHash, p.ID, p.Age-1, prev.hash)})
			}
		}
		r.states[verKey{p.ID, p.Age}] = state{output: res.Writes[p.ID], hash: h, nonce: n}
	}
	return nil
}

func clip(b []byte) string {
	if len(b) > 80 {
		return string(b[:77]) + "..."
	}
	return string(b)
}

// graphNodes returns the new transactions (focus), the validated ones that
// overlap them in clock time, and every other transaction sharing a
// version with any of those.
func (r *run) graphNodes() ([]*mvsg.Txn, error) {
	var nodes []*mvsg.Txn
	add := func(n *mvsg.Txn) {
		r.byNonce[n.ID] = n
		nodes = append(nodes, n)
	}
	lo := int64(math.MaxInt64)
	for _, t := range r.focus {
		add(&mvsg.Txn{ID: t.Request.Nonce, Begin: t.Begin, End: t.End, Reads: t.Receipt.Input, Writes: t.Receipt.Writes, Focus: true})
		lo = min(lo, t.Begin)
	}
	// Validated transactions that overlap: those that ended at or after
	// lo; widen lo to the earliest begin among them until it is stable.
	hi, err := r.v.clock.current(r.ctx)
	if err != nil {
		return nil, err
	}
	from := int64(math.MaxInt64)
	for lo < from {
		var ctxTxs []*Tx
		ctxTxs, err = r.v.endedBetween(r.ctx, lo, min(from, hi+1))
		if err != nil {
			return nil, err
		}
		from = lo
		for _, t := range ctxTxs {
			if _, dup := r.byNonce[t.Request.Nonce]; dup {
				continue // ends rows are written for committed transactions only
			}
			add(&mvsg.Txn{ID: t.Request.Nonce, Begin: t.Begin, End: t.End, Reads: t.Receipt.Input, Writes: t.Receipt.Writes})
			lo = min(lo, t.Begin)
		}
	}
	// Neighbours through shared versions, from the accesses index.
	span := map[string][2]int64{}
	for _, n := range nodes {
		for _, m := range []map[string]int64{n.Reads, n.Writes} {
			for k, a := range m {
				s, ok := span[k]
				if !ok {
					s = [2]int64{a, a}
				}
				span[k] = [2]int64{min(s[0], a), max(s[1], a)}
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(span)) {
		rows, err := r.v.accesses(r.ctx, k, span[k][0]-1, span[k][1]+1)
		if err != nil {
			return nil, err
		}
		for _, row := range rows {
			nonce := row["nonce"].AsText()
			n, ok := r.byNonce[nonce]
			if !ok {
				n = &mvsg.Txn{ID: nonce, Begin: row["begin_clock"].AsBigInt(), End: row["end_clock"].AsBigInt(),
					Reads: map[string]int64{}, Writes: map[string]int64{}}
				add(n)
			}
			if n.Focus {
				continue
			}
			if row["op"].AsText() == "w" {
				n.Writes[k] = row["age"].AsBigInt()
			} else {
				n.Reads[k] = row["age"].AsBigInt()
			}
		}
	}
	return nodes, nil
}

// endedBetween loads the validated transactions whose end clock is in
// [lo, hi).
func (v *Validator) endedBetween(ctx context.Context, lo, hi int64) ([]*Tx, error) {
	var out []*Tx
	for b := lo / endBucketSpan; b <= (hi-1)/endBucketSpan && lo < hi; b++ {
		var err error
		if out, err = v.loadListed(ctx, out, &storage.Scan{Namespace: v.ns, Table: tEnds, Partition: storage.Values{"bucket": storage.BigInt(b)},
			Start: &storage.Bound{Key: storage.Values{"end_clock": storage.BigInt(lo)}, Inclusive: true},
			End:   &storage.Bound{Key: storage.Values{"end_clock": storage.BigInt(hi)}, Inclusive: false}}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// accesses returns the accesses index rows of key id with ages in [lo, hi].
func (v *Validator) accesses(ctx context.Context, id string, lo, hi int64) ([]storage.Row, error) {
	rows, err := v.scanRows(ctx, &storage.Scan{Namespace: v.ns, Table: tAccesses, Partition: storage.Values{"id": storage.Text(id)},
		Start: &storage.Bound{Key: storage.Values{"age": storage.BigInt(lo)}, Inclusive: true},
		End:   &storage.Bound{Key: storage.Values{"age": storage.BigInt(hi)}, Inclusive: true}})
	return rows, err
}

// persist records the run: states, indexes, the validated marks, the
// violations, and removes the covered transactions from pending. Writes go
// in batches, one transaction each, and each first runs fence in the same
// transaction (the lease check: a batch commits only while this run still
// holds the lease).
func (r *run) persist(fence func(context.Context, storage.Txn) error) error {
	b := &batcher{ctx: r.ctx, db: r.v.db, fence: fence}
	ns := r.v.ns
	keys := map[string]int64{} // once each: concurrent batches must not write one row twice
	for _, t := range r.focus {
		n := storage.Text(t.Request.Nonce)
		for _, p := range t.Proofs {
			if s, ok := r.states[verKey{p.ID, p.Age}]; ok && s.nonce == t.Request.Nonce {
				b.put(&storage.Put{Namespace: ns, Table: tStates, Partition: storage.Values{"id": storage.Text(p.ID)},
					Clustering: storage.Values{"age": storage.BigInt(p.Age)},
					Values:     storage.Values{"output": storage.Text(string(s.output)), "hash": storage.Blob(s.hash), "nonce": n}})
			}
		}
		clocks := storage.Values{"begin_clock": storage.BigInt(t.Begin), "end_clock": storage.BigInt(t.End)}
		for op, m := range map[string]map[string]int64{"r": t.Receipt.Input, "w": t.Receipt.Writes} {
			for k, a := range m {
				b.put(&storage.Put{Namespace: ns, Table: tAccesses, Partition: storage.Values{"id": storage.Text(k)},
					Clustering: storage.Values{"age": storage.BigInt(a), "op": storage.Text(op), "nonce": n}, Values: clocks})
				keys[k] = max(keys[k], t.End)
			}
		}
		b.put(&storage.Put{Namespace: ns, Table: tEnds, Partition: storage.Values{"bucket": storage.BigInt(t.End / endBucketSpan)},
			Clustering: storage.Values{"end_clock": storage.BigInt(t.End), "nonce": n}, Values: storage.Values{"begin_clock": storage.BigInt(t.Begin)}})
	}
	for k, seen := range keys {
		b.put(&storage.Put{Namespace: ns, Table: tKeys, Partition: storage.Values{"bucket": storage.Text(keysBucket)},
			Clustering: storage.Values{"id": storage.Text(k)}, Values: storage.Values{"seen": storage.BigInt(seen)}})
	}
	// A violation's row is keyed by what it is, not by when it was found:
	// at is the latest end clock among its transactions, seq a digest of
	// its body. Validating the same transactions again (after a crash
	// between the two flushes below) rewrites the same rows.
	for _, vl := range r.found {
		body, _ := json.Marshal(vl) // plain data always marshals
		at := int64(0)
		for _, n := range vl.Txs {
			if g, ok := r.byNonce[n]; ok {
				at = max(at, g.End)
			}
		}
		h := fnv.New64a()
		h.Write(body)
		b.put(&storage.Put{Namespace: ns, Table: tViolations, Partition: storage.Values{"bucket": storage.Text(violBucket)},
			Clustering: storage.Values{"at": storage.BigInt(at), "seq": storage.BigInt(int64(h.Sum64() >> 1))},
			Values:     storage.Values{"kind": storage.Text(string(vl.Kind)), "body": storage.Text(string(body))}})
	}
	// Everything above first: a crash between the two steps leaves the
	// transactions pending, to be validated again, never marked validated
	// without their states, indexes and violations.
	if err := b.flush(); err != nil {
		return err
	}
	for _, t := range append(slices.Clip(r.focus), r.aborted...) {
		n := storage.Text(t.Request.Nonce)
		b.put(&storage.Put{Namespace: ns, Table: tTxs, Partition: storage.Values{"nonce": n}, Values: storage.Values{"validated": storage.BigInt(1)}})
		b.del(&storage.Delete{Namespace: ns, Table: tPending, Partition: storage.Values{"bucket": storage.BigInt(pendingBucket(t.Request.Nonce))},
			Clustering: storage.Values{"begin_clock": storage.BigInt(t.Begin), "nonce": n}})
	}
	return b.flush()
}

// batcher groups writes into transactions of up to batchSize each.
type batcher struct {
	ctx   context.Context
	db    storage.Backend
	fence func(context.Context, storage.Txn) error // run first in every batch
	ms    []storage.Mutation
}

const batchSize = 512

func (b *batcher) put(p *storage.Put) {
	b.ms = append(b.ms, p)
}

func (b *batcher) del(d *storage.Delete) {
	b.ms = append(b.ms, d)
}

func (b *batcher) flush() error {
	chunks := make(chan []storage.Mutation)
	errs := make(chan error, flushWorkers)
	for range flushWorkers {
		go func() {
			var first error
			for chunk := range chunks {
				if first == nil {
					first = b.write(chunk)
				}
			}
			errs <- first
		}()
	}
	for len(b.ms) > 0 {
		n := min(len(b.ms), batchSize)
		chunks <- b.ms[:n]
		b.ms = b.ms[n:]
	}
	close(chunks)
	var err error
	for range flushWorkers {
		err = errors.Join(err, <-errs)
	}
	b.ms = nil
	return err
}

// flushWorkers write batches concurrently, so that their commits share
// the database's group commit.
const flushWorkers = 8

func (b *batcher) write(chunk []storage.Mutation) error {
	err := storage.Update(b.ctx, b.db, func(tx storage.Txn) error {
		if err := b.fence(b.ctx, tx); err != nil {
			return err
		}
		for _, m := range chunk {
			var err error
			switch m := m.(type) {
			case *storage.Put:
				err = tx.Put(b.ctx, m)
			case *storage.Delete:
				err = tx.Delete(b.ctx, m)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("validator: recording validation: %w", err)
	}
	return nil
}

// storedViolations returns the recorded violations in scope.
func (v *Validator) storedViolations(ctx context.Context, s Scope) ([]Violation, error) {
	all, err := v.scanRows(ctx, &storage.Scan{Namespace: v.ns, Table: tViolations, Partition: storage.Values{"bucket": storage.Text(violBucket)}})
	if err != nil {
		return nil, err
	}
	var out []Violation
	for _, row := range all {
		var vl Violation
		if err := json.Unmarshal([]byte(row["body"].AsText()), &vl); err != nil {
			return nil, fmt.Errorf("validator: stored violation: %w", err)
		}
		if s.matches(&vl) {
			out = append(out, vl)
		}
	}
	return out, nil
}

func (s Scope) matches(vl *Violation) bool {
	if s.Nonce != "" {
		return slices.Contains(vl.Txs, s.Nonce)
	}
	keyIn := func(k string, age int64) bool {
		if s.Key != "" {
			return k == s.Key && (s.Age < 0 || age == s.Age)
		}
		return k >= s.KeyStart && (s.KeyEnd == "" || k < s.KeyEnd)
	}
	if vl.Key != "" && keyIn(vl.Key, vl.Age) {
		return true
	}
	for _, e := range vl.Edges {
		if keyIn(e.Key, e.Age) {
			return true
		}
	}
	return false
}
