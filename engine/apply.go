package engine

import (
	"fmt"
	"slices"

	"github.com/kiroku-db/kiroku/storage"
)

// stateMachine applies the log's records (records.go) to the engine's
// tables and catalog, in log order: recovery at Open applies the log on
// disk with it, and a follower applies a leader's records with it as they
// arrive (DB.Apply). It is the one place that decides what a record does.
//
// Buffers are applied once durable: once the marks of every logger of the
// era cover their epoch (D = min over the era's loggers of their last
// mark). Until then they are held (pending), in log order; a void record
// drops the held buffers of its epochs, which were never acknowledged. An
// era record starts a leader's term of office with D one below its first
// epoch: every earlier epoch was made durable or void before it. Per key
// the highest TID wins, so buffers made durable together may be applied
// in any order, in parallel (apply); a DDL record is applied once every
// buffer before it has been (barrier), and at once: it was durable before
// the DDL returned, and no buffer of its table comes before it.
//
// It is not safe for concurrent use: one goroutine applies the log.
type stateMachine struct {
	db *DB
	// from is the start of the checkpoint chain loaded (Cs): buffers of
	// earlier epochs are in it, and skipped.
	from uint64
	// durable is D; marks the era's loggers' last marks.
	durable uint64
	marks   []uint64
	// pending holds the buffers of epochs above D, by epoch, in log order.
	pending      map[uint64][]heldBuffer
	pendingBytes int64
	void         []epochRange
	// floor is the highest floor record's F: the log may lack records of
	// epochs before it.
	floor uint64
	// maxSeen is the largest epoch any record names (a mark X counting as
	// X+1, see spanEpoch): a new era starts above it.
	maxSeen uint64
	last    uint64 // index of the last record applied

	// apply installs a durable buffer read at index; barrier waits until
	// every buffer handed to apply is installed and returns the first
	// error of any.
	apply   func(index uint64, rec []byte)
	barrier func() error

	applied, voidRecords, voidBytes int64
}

// heldBuffer is a buffer record waiting for its epoch to become durable.
type heldBuffer struct {
	index uint64
	rec   []byte
}

// newStateMachine starts from a loaded checkpoint chain: its start Cs, its
// end Ce (durable when it was written, so D starts there), and the era's
// logger count its catalog names. apply and barrier are the dispatch of
// durable buffers (see stateMachine).
func newStateMachine(db *DB, cs, ce uint64, loggers int, apply func(uint64, []byte), barrier func() error) *stateMachine {
	sm := &stateMachine{db: db, from: cs, durable: ce, maxSeen: ce, pending: map[uint64][]heldBuffer{}, apply: apply, barrier: barrier}
	sm.marks = make([]uint64, loggers)
	for i := range sm.marks {
		sm.marks[i] = ce
	}
	return sm
}

// step applies the record at index. An error is corruption: the log says
// something that cannot be; nothing after it may be applied.
func (sm *stateMachine) step(index uint64, rec []byte) error {
	if index <= sm.last {
		return &CorruptionError{File: "log", Offset: int64(index), Err: malformed("record %d after record %d", index, sm.last)}
	}
	r, err := decodeRecord(rec)
	if err == nil {
		err = sm.stepRecord(index, r, rec)
	}
	if err != nil {
		return &CorruptionError{File: "log", Offset: int64(index), Err: err}
	}
	sm.last = index
	return nil
}

func (sm *stateMachine) stepRecord(index uint64, r logRecord, rec []byte) error {
	sm.maxSeen = max(sm.maxSeen, r.spanEpoch())
	switch r.kind {
	case recBuffer, recPlainBuffer:
		e := r.epoch
		switch {
		case e < sm.from:
		case isVoid(sm.void, e):
			sm.voidRecords++
			sm.voidBytes += int64(len(rec))
		case e <= sm.durable:
			sm.applied++
			sm.apply(index, slices.Clone(rec))
		default:
			sm.pending[e] = append(sm.pending[e], heldBuffer{index, slices.Clone(rec)})
			sm.pendingBytes += int64(len(rec))
		}
	case recMark:
		if r.logger >= len(sm.marks) {
			return malformed("mark of logger %d in an era of %d loggers", r.logger, len(sm.marks))
		}
		sm.marks[r.logger] = max(sm.marks[r.logger], r.x)
		sm.advance(slices.Min(sm.marks))
	case recDDL:
		if err := sm.barrier(); err != nil {
			return err
		}
		c := &sm.db.cat
		c.mu.Lock()
		err := c.applyLocked(r.op)
		c.mu.Unlock()
		if err != nil {
			return malformed("catalog change: %v", err)
		}
	case recVoid:
		v := epochRange{r.epoch, r.x}
		if v.To >= sm.from && v.From <= sm.durable {
			// (A range wholly below the checkpoints' start is history:
			// their rows hold none of its writes.)
			return malformed("void epochs %d..%d, but epoch %d is durable", v.From, v.To, sm.durable)
		}
		for e, bufs := range sm.pending {
			if e >= v.From && e <= v.To {
				for _, b := range bufs {
					sm.voidRecords++
					sm.voidBytes += int64(len(b.rec))
					sm.pendingBytes -= int64(len(b.rec))
				}
				delete(sm.pending, e)
			}
		}
		sm.void = append(sm.void, v)
	case recEra:
		if len(sm.pending) > 0 {
			return malformed("an era begins while %d epochs above the durable %d are undecided", len(sm.pending), sm.durable)
		}
		sm.marks = make([]uint64, r.logger)
		for i := range sm.marks {
			sm.marks[i] = r.epoch - 1
		}
		sm.advance(r.epoch - 1)
	case recFloor:
		sm.floor = max(sm.floor, r.epoch)
	}
	return nil
}

// advance raises D to d and applies the held buffers it makes durable, in
// epoch order.
func (sm *stateMachine) advance(d uint64) {
	if d <= sm.durable {
		return
	}
	sm.durable = d
	var ready []uint64
	for e := range sm.pending {
		if e <= d {
			ready = append(ready, e)
		}
	}
	slices.Sort(ready)
	for _, e := range ready {
		for _, b := range sm.pending[e] {
			sm.applied++
			sm.pendingBytes -= int64(len(b.rec))
			sm.apply(b.index, b.rec)
		}
		delete(sm.pending, e)
	}
}

// undecided is the range of epochs above D that records name: on a leader
// that takes over the log (Open, or a follower promoted), they can never
// become durable, and are made void before anything new is logged.
func (sm *stateMachine) undecided() (epochRange, bool) {
	if sm.maxSeen <= sm.durable {
		return epochRange{}, false
	}
	return epochRange{sm.durable + 1, sm.maxSeen}, true
}

func isVoid(void []epochRange, e uint64) bool {
	for _, r := range void {
		if e >= r.From && e <= r.To {
			return true
		}
	}
	return false
}

// inlineApply is the dispatch of a follower: each durable buffer is
// installed at once, on the applying goroutine.
type inlineApply struct {
	db  *DB
	err error
}

func (a *inlineApply) apply(index uint64, rec []byte) {
	if a.err != nil {
		return
	}
	if err := a.db.applyBuffer(rec); err != nil {
		a.err = &CorruptionError{File: "log", Offset: int64(index), Err: err}
	}
}

func (a *inlineApply) barrier() error { return a.err }

// poolApply is the dispatch of recovery: durable buffers are decoded and
// installed on every core.
type poolApply struct {
	p *pool
}

func newPoolApply(db *DB, workers int) *poolApply {
	return &poolApply{p: startPool(workers, func(at int64, rec []byte) error {
		if err := db.applyBuffer(rec); err != nil {
			return &CorruptionError{File: "log", Offset: at, Err: err}
		}
		return nil
	})}
}

func (a *poolApply) apply(index uint64, rec []byte) { a.p.submit(int64(index), rec) }
func (a *poolApply) barrier() error                 { return a.p.drain() }
func (a *poolApply) close() error                   { return a.p.wait() }

// follow readies a follower (Config.Follow): no log, no loggers, no
// epochs of its own; Apply feeds its state machine.
func (db *DB) follow() {
	ia := &inlineApply{db: db}
	db.follower = newStateMachine(db, 0, 0, 1, ia.apply, ia.barrier)
	db.followApply = ia
	db.following.Store(true)
	db.resetEpochs(1, 0)
}

// Apply applies the record at index of the leader's log to a follower
// (Config.Follow): records must come in log order, each once, from the
// first the leader wrote (its era) on. Buffers take effect once marks make
// their epoch durable, as they did for the leader's commits; DurableEpoch
// is then the leader's, as far as the records applied tell. An error is
// corruption of the records, or of their order: the follower must not
// apply anything after it. Apply is safe for concurrent use but applies
// one record at a time.
func (db *DB) Apply(index uint64, rec []byte) error {
	if !db.following.Load() {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "apply", Detail: "the engine is not a follower (Config.Follow)"}
	}
	if err := db.usable("apply"); err != nil {
		return err
	}
	db.followMu.Lock()
	defer db.followMu.Unlock()
	sm := db.follower
	err := sm.step(index, rec)
	if err == nil {
		err = db.followApply.barrier()
	}
	if err != nil {
		db.fail(fmt.Errorf("applying the leader's record %d: %w", index, err))
		return err
	}
	// The follower's epoch stays above every epoch applied, so that a
	// read-only transaction's newest version read is of an epoch it knows.
	db.wmu.Lock()
	db.stepLocked(epochMsg{ev: evApplied, epoch: sm.durable, seen: sm.maxSeen + 1})
	db.wmu.Unlock()
	return nil
}
