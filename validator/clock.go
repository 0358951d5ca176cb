package validator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kiroku-db/kiroku/storage"
)

// ClockConfig sets up the logical clock (seed 000 §4.2.2–4.2.3).
type ClockConfig struct {
	// Counters is K, the counter records the clock table holds; 0 means 1.
	// A scan reads all K, an end clock taken after a scan raises one of
	// them (round-robin), a claimed end clock raises every one and a
	// claimed begin clock reads every one (the committers' transactions on
	// a shared database, see doc.go). More counters
	// spread the raises that follow scans over more rows, which matters
	// only to processes whose claims keep failing because others raise the
	// counters; but every claim writes each counter, and every scan reads
	// it. With one process on PostgreSQL, K = 4 added about 0.1 ms to a
	// lone transaction against K = 1 and gave the same throughput at 64
	// threads (docs/benchmarks.md). On the engine, when its
	// clocks still scanned, a begin and end clock cost about 14, 22 and
	// 40 µs of CPU at K = 1, 4 and 16 with 64 concurrent callers; one
	// counter write is shorter than a scan, so contention cost little even
	// at K = 1.
	Counters int
	// ScanEvery is N: a begin clock scans the table only every Nth time
	// and otherwise takes one more than the highest value this process has
	// seen, touching no record. End clocks always scan (see doc.go for why
	// this split keeps the clock sound). 0 or 1 means every time. On a
	// shared database it applies only to the begin clocks that are not
	// claimed (after a failed claim, or before the process has seen a
	// value): a claimed one reads every counter at no cost. On an
	// exclusive database (storage.Exclusive: the embedded engine) no clock
	// scans the table, whatever N and K (doc.go, "One process").
	ScanEvery int
}

func (c ClockConfig) withDefaults() (ClockConfig, error) {
	if c.Counters < 0 || c.Counters > 4096 {
		return c, fmt.Errorf("%w: clock counters %d; want 1–4096 (0 for 1)", ErrConfig, c.Counters)
	}
	if c.ScanEvery < 0 {
		return c, fmt.Errorf("%w: clock scan-every %d is negative", ErrConfig, c.ScanEvery)
	}
	if c.Counters == 0 {
		c.Counters = 1
	}
	if c.ScanEvery == 0 {
		c.ScanEvery = 1
	}
	return c, nil
}

// Clock hands out logical times from the clock table. Its reads and writes
// are not transactional and it takes no lock: a counter only ever grows,
// because every write is conditional on the stored value being smaller.
// It is safe for concurrent use.
type Clock struct {
	db   storage.Ops
	ns   string
	cfg  ClockConfig
	next atomic.Uint64 // round-robin over the counters
	ops  atomic.Uint64 // begin clocks taken, for ScanEvery
	// seen is the highest value this process has read or written: the
	// Clock's own, or, on an exclusive database, the highest it has read
	// at open or handed out, which every Clock of the process on that
	// database and namespace shares (see owned).
	seen *atomic.Int64
	// owned: the database is storage.Exclusive, so every counter write is
	// made through a Clock sharing seen and held, and clocks are taken
	// from seen without scanning the table (see doc.go).
	owned bool
	held  *reservation // on an exclusive database; shared like seen
	// scan reads every counter and slots[i] is counter i's clustering key:
	// built once, as backends only read a request.
	scan  *storage.Scan
	slots []storage.Values
	// raises holds spent *raise, for reuse: a backend keeps no reference
	// to a request once the call returns.
	raises sync.Pool
	// begins and ends share scans (and end writes) among this process's
	// concurrent callers (see coalescer).
	begins, ends coalescer
	// claims are claimIn's writes, one per counter, and expects hold
	// expectIn's conditions, reused (perCounter): only one committer calls
	// each, with one transaction under way at a time, and that transaction
	// has ended before the next call.
	claims, expects []*raise
}

// raise is a write of one counter on condition that it holds less
// (newRaise, to).
type raise struct {
	put  storage.Put
	cond storage.Condition
	expr [1]storage.Expr
}

// newRaise returns a raise of counter slot, its value set by to.
func (c *Clock) newRaise(slot int) *raise {
	r := &raise{put: storage.Put{Namespace: c.ns, Table: tClock, Partition: c.scan.Partition, Clustering: c.slots[slot], Values: make(storage.Values, 1)},
		cond: storage.Condition{Kind: storage.CondIf}}
	r.cond.Exprs, r.put.Condition = r.expr[:], &r.cond
	return r
}

// to makes r write t, on condition that the counter holds less.
func (r *raise) to(t int64) {
	r.put.Values["value"], r.expr[0] = storage.BigInt(t), storage.Lt("value", storage.BigInt(t))
}

// perCounter returns a raise of each counter, in counter order.
func (c *Clock) perCounter() []*raise {
	rs := make([]*raise, c.cfg.Counters)
	for i := range rs {
		rs[i] = c.newRaise(i)
	}
	return rs
}

// ownedKey is the key of an exclusive database's shared clock state for
// one namespace (storage.Exclusive.Shared).
type ownedKey struct{ ns string }

// ownedState is what the Clocks of one process share on an exclusive
// database and namespace.
type ownedState struct {
	seen atomic.Int64
	held reservation
}

// reservation is, on an exclusive database, the value the counters were
// last raised to: clocks up to it are handed out with no write, and seen
// never exceeds it (see doc.go, "One process").
type reservation struct {
	mu  sync.Mutex // serializes the counter writes that raise top
	top atomic.Int64
}

// reserveAhead is how far past the clock that needs it a reservation
// reaches: one counter write per reserveAhead end clocks. A reopened
// database starts at the last reservation, so up to this many values are
// never used, which costs nothing.
const reserveAhead = 1 << 12

func newClock(ctx context.Context, db storage.Ops, ns string, cfg ClockConfig) (*Clock, error) {
	c := &Clock{ns: ns, cfg: cfg, seen: new(atomic.Int64)}
	if x, ok := db.(storage.Exclusive); ok {
		st := x.Shared(ownedKey{ns}, func() any { return new(ownedState) }).(*ownedState)
		c.owned, c.seen, c.held = true, &st.seen, &st.held
	}
	c.db = storage.Unsynced(db) // see doc.go: the log rows carry the clock to disk
	part := storage.Values{"bucket": storage.Text(clockBucket)}
	c.scan = &storage.Scan{Namespace: ns, Table: tClock, Partition: part, Projection: []string{"value"}}
	for i := range cfg.Counters {
		c.slots = append(c.slots, storage.Values{"counter": storage.BigInt(int64(i))})
		err := c.db.Put(ctx, &storage.Put{Namespace: ns, Table: tClock, Partition: part,
			Clustering: c.slots[i], Values: storage.Values{"value": storage.BigInt(0)},
			Condition: storage.IfNotExists()})
		if err != nil && !errors.Is(err, storage.ErrConditionNotMet) {
			return nil, fmt.Errorf("validator: creating clock counter %d: %w", i, err)
		}
	}
	if c.owned {
		// What the counters hold from before this process opened the
		// database (recovered), or the reservation of Clocks that opened
		// it before in this process.
		m, err := c.latest(ctx)
		if err != nil {
			return nil, err
		}
		c.held.mu.Lock()
		c.held.top.Store(max(c.held.top.Load(), m))
		c.held.mu.Unlock()
		c.see(m)
	}
	return c, nil
}

// Begin returns a begin time, to be taken before the request is logged:
// one more than the highest counter. It writes nothing (see doc.go).
// Callers that arrive while another begin clock is being taken share the
// next one (see coalescer). On an exclusive database it is one more than
// the highest value the process has seen, and reads nothing.
func (c *Clock) Begin(ctx context.Context) (int64, error) {
	if c.owned {
		return c.seen.Load() + 1, nil
	}
	if c.cfg.ScanEvery > 1 && c.ops.Add(1)%uint64(c.cfg.ScanEvery) != 0 {
		if s := c.seen.Load(); s > 0 {
			return s + 1, nil
		}
	}
	return c.begins.do(ctx, c.begin)
}

func (c *Clock) begin(ctx context.Context) (int64, error) {
	m, err := c.latest(ctx)
	if err != nil {
		return 0, err
	}
	c.see(m)
	return m + 1, nil
}

// End returns an end time, to be taken after the reply arrived: it scans
// every counter, takes max + 1 and raises one counter (round-robin) to it.
// Callers that arrive while another end clock is being taken share the
// next one (see coalescer).
// The backends retry a lone write's conflicts a few times; on PostgreSQL
// (SERIALIZABLE) many callers raising the same counter can outlast that,
// so the write, which is idempotent, is retried here as the scan is.
//
// On an exclusive database an end clock is one more than the highest value
// the process has seen, and raises that value: no scan, no coalescing. A
// counter is written only once every reserveAhead clocks, to reserve the
// next ones; it carries the clock to disk and to the next process to open
// the database (see doc.go).
func (c *Clock) End(ctx context.Context) (int64, error) {
	if c.owned {
		return c.endOwned(ctx)
	}
	return c.ends.do(ctx, c.end)
}

func (c *Clock) endOwned(ctx context.Context) (int64, error) {
	for {
		s := c.seen.Load()
		t := s + 1
		if t > c.held.top.Load() {
			if err := c.reserve(ctx, t); err != nil {
				return 0, err
			}
			continue
		}
		if c.seen.CompareAndSwap(s, t) {
			return t, nil
		}
	}
}

// reserve raises a counter to t + reserveAhead − 1 unless the reservation
// already covers t, and only then lets clocks up to it be handed out.
func (c *Clock) reserve(ctx context.Context, t int64) error {
	c.held.mu.Lock()
	defer c.held.mu.Unlock()
	if t <= c.held.top.Load() {
		return nil // another caller reserved it meanwhile
	}
	top := t + reserveAhead - 1
	if err := c.raise(ctx, top); err != nil {
		return err
	}
	c.held.top.Store(top)
	return nil
}

// EndUnraised is End without the counter write, on a database other
// processes share (the stamp committer's, after a claim failed): the
// caller must commit raiseIn(t), in a transaction that carries the
// clock's log row, before it returns t to anyone or the transaction's
// caller returns (see doc.go, "Group commit on a shared database").
//
// Without the write an end clock is what a begin clock is, max + 1 of a
// scan that began after the caller asked, so it shares the begin clocks'
// scans; never ScanEvery's skipped ones. It must not share End's runs: a
// caller of End would get a value nobody raised.
func (c *Clock) EndUnraised(ctx context.Context) (int64, error) {
	return c.begins.do(ctx, c.begin)
}

// guess returns the clock a committer's transaction may claim without a
// scan (claimIn, expectIn): one more than the highest value this process
// has seen, which is what a scan finds while no other process raised a
// counter since. It returns false on an exclusive database, whose clocks
// never scan, and before this process has seen any value.
func (c *Clock) guess() (int64, bool) {
	s := c.seen.Load()
	return s + 1, !c.owned && s > 0
}

// claimIn raises every counter to t in tx, each write Deferred on the
// counter holding less. The transaction then commits only if t was above
// every counter when it ran, so t is what an end scan would have given
// then, or more; and a counter holds t once it has committed: an end
// clock taken and raised, with no round trip of its own (see doc.go,
// "Group commit on a shared database").
func (c *Clock) claimIn(ctx context.Context, tx storage.Txn, t int64) error {
	if c.claims == nil {
		c.claims = c.perCounter()
		for _, r := range c.claims {
			r.put.Deferred = true
		}
	}
	for _, r := range c.claims {
		r.to(t)
		if err := tx.Put(ctx, &r.put); err != nil {
			return fmt.Errorf("validator: claiming end clock %d: %w", t, err)
		}
	}
	return nil
}

// expectIn makes tx commit only if every counter holds less than t, and
// writes nothing: t is then max + 1 of the counters as tx read them, a
// begin clock taken inside the transaction that logs the request, with no
// round trip of its own (see doc.go, "Group commit on a shared
// database").
func (c *Clock) expectIn(ctx context.Context, tx storage.Txn, t int64) error {
	if c.expects == nil {
		c.expects = c.perCounter() // only their conditions are used
	}
	for _, r := range c.expects {
		r.to(t)
		x := storage.Expect{Namespace: c.ns, Table: tClock, Partition: r.put.Partition, Clustering: r.put.Clustering, Condition: r.put.Condition}
		if err := tx.Expect(ctx, &x); err != nil {
			return fmt.Errorf("validator: claiming begin clock %d: %w", t, err)
		}
	}
	return nil
}

// raiseIn raises a counter to t in tx, unless it already holds t or more.
// The write is not put back in c.raises: tx may hold it until it ends.
func (c *Clock) raiseIn(ctx context.Context, tx storage.Txn, t int64) error {
	r := c.raiseOf(t)
	if err := tx.Put(ctx, &r.put); err != nil {
		return fmt.Errorf("validator: advancing the clock: %w", err)
	}
	return nil
}

func (c *Clock) end(ctx context.Context) (int64, error) {
	latest, err := c.latest(ctx)
	if err != nil {
		return 0, err
	}
	t := latest + 1
	if err := c.raise(ctx, t); err != nil {
		return 0, err
	}
	// Only now does a counter hold t: a ScanEvery begin clock built on a
	// value no counter holds could miss an overlap.
	c.see(t)
	return t, nil
}

// raise writes t to the next counter (round-robin) unless it holds t or
// more already.
func (c *Clock) raise(ctx context.Context, t int64) error {
	r := c.raiseOf(t)
	// A counter already past t (another caller raised it) is skipped:
	// a scan sees it as well.
	err := retry(ctx, func() error { return c.db.Put(ctx, &r.put) })
	c.raises.Put(r)
	if err != nil {
		return fmt.Errorf("validator: advancing the clock: %w", err)
	}
	return nil
}

// raiseOf returns the conditional write that raises the next counter,
// round-robin, to t; put it back in c.raises once done.
func (c *Clock) raiseOf(t int64) *raise {
	slot := int(c.next.Add(1) % uint64(c.cfg.Counters))
	r, ok := c.raises.Get().(*raise)
	if !ok {
		// Skippable: a counter already past t needs nothing, and a
		// transaction (raiseIn) can then send the write without waiting for
		// its answer.
		r = c.newRaise(slot)
		r.put.Skippable = true
	}
	r.put.Clustering = c.slots[slot]
	r.to(t)
	return r
}

// see raises the highest value this process has read or written to t.
func (c *Clock) see(t int64) {
	for {
		s := c.seen.Load()
		if s >= t || c.seen.CompareAndSwap(s, t) {
			return
		}
	}
}

// current returns a clock value at least every end clock handed out
// before the call and below every end clock asked for after it returns,
// which validation's horizon relies on: on an exclusive database the
// shared value (not the counters, whose reservation runs ahead of it);
// elsewhere the highest counter.
func (c *Clock) current(ctx context.Context) (int64, error) {
	if c.owned {
		return c.seen.Load(), nil
	}
	return c.latest(ctx)
}

// latest returns the highest value any counter holds. Like scanRows, it
// retries a retryable failure while the rows stream.
func (c *Clock) latest(ctx context.Context) (int64, error) {
	var m int64
	err := retry(ctx, func() error {
		rows, err := c.db.Scan(ctx, c.scan)
		if err != nil {
			return err
		}
		defer rows.Close()
		m = 0
		for rows.Next() {
			v, _ := storage.RowColumn(rows, "value") // no map per counter
			m = max(m, v.AsBigInt())
		}
		return rows.Err()
	})
	if err != nil {
		return 0, fmt.Errorf("validator: reading the clock: %w", err)
	}
	return m, nil
}

// retry runs op until it succeeds, fails for good, or the default retry
// policy gives up on retryable conflicts.
func retry(ctx context.Context, op func() error) error {
	var p storage.RetryPolicy
	for failure := 1; ; failure++ {
		err := op()
		if err == nil || !storage.IsRetryable(err) || failure >= 20 {
			return err
		}
		if serr := p.Sleep(ctx, failure); serr != nil {
			return errors.Join(err, serr)
		}
	}
}

// coalescer runs an operation once for all the callers that arrive while
// an earlier run is under way: they form a flight, and one of them runs
// it after that run ends, so the run starts after every one of them
// arrived. For a clock that is all a caller needs (doc.go): its scan
// begins after it asked, and an end clock's write is done before it
// returns. Callers may share a clock value; equal clocks order nothing.
// At 64 clients a begin and an end clock had cost the Validator about
// 4 µs of CPU per transaction; sharing them saved 2–3 µs.
//
// A flight runs without its callers' cancellation: none may leave early
// (the one handed the run must run it), and a run is short.
type coalescer struct {
	mu   sync.Mutex
	busy bool    // a run is under way
	open *flight // the callers waiting for the next run
}

type flight struct {
	lead chan struct{} // one token: the caller that takes it runs the flight
	done chan struct{} // closed when v and err are set
	v    int64
	err  error
}

func (c *coalescer) do(ctx context.Context, op func(context.Context) (int64, error)) (int64, error) {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		v, err := op(ctx)
		c.handOn()
		return v, err
	}
	f := c.open
	if f == nil {
		f = &flight{lead: make(chan struct{}, 1), done: make(chan struct{})}
		c.open = f
	}
	c.mu.Unlock()
	select {
	case <-f.done:
	case <-f.lead:
		f.v, f.err = op(context.WithoutCancel(ctx))
		close(f.done)
		c.handOn()
	}
	return f.v, f.err
}

// handOn ends a run: the flight that gathered during it runs next, by one
// of its callers, or the coalescer is idle.
func (c *coalescer) handOn() {
	c.mu.Lock()
	f := c.open
	c.open = nil
	c.busy = f != nil
	c.mu.Unlock()
	if f != nil {
		f.lead <- struct{}{}
	}
}
