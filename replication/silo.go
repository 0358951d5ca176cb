package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kiroku-db/kiroku/engine"
)

// Silo is one member of a replicated engine (seed 002, RaftSilo): the
// embedded engine whose log is the Raft group's. Each engine log record
// is one Raft entry, byte for byte. While another node leads, the engine
// is a follower (engine.Config.Follow) that applies the committed entries
// as they are applied (hot standby), and refuses writes. Once this node
// leads and has applied every entry committed before its term, the engine
// is promoted (engine.DB.Promote): it voids the epochs no longer
// completable, starts its era, and proposes its loggers' buffers as
// entries; an epoch is durable once all its entries are committed by a
// majority, and commits are acknowledged only then, as with the local
// WAL. A leader that loses its office fails what it had in flight
// (engine.LeadershipLostError) and stops: its memory may hold commits the
// new leader voids, so its owner opens the member again, as a follower
// that applies the log from its snapshot on.
//
// The leading engine's checkpoints compact the Raft log (the log before
// a checkpoint's start is truncated, TruncateFront): the Raft snapshot
// stands for the engine's checkpoint chain. A follower behind the
// compacted log is streamed the engine's snapshot, which it checks,
// keeps and installs into a fresh engine (snapshot.go); a restarted
// member reloads its snapshot — the chain it wrote while it led, or the
// stream it kept — and applies the log after it. Followers' engines keep
// their state in memory and write no checkpoints, so a follower keeps
// its whole log (back to its last snapshot) to restart from.
type Silo struct {
	node *Node
	run  *Runner
	// db is the member's engine; installing a snapshot replaces it.
	db    atomic.Pointer[engine.DB]
	ecfg  engine.Config // a new engine's configuration
	snaps snapshots

	// propMu keeps the order of proposals and of pending the same.
	propMu sync.Mutex
	mu     sync.Mutex
	// leading is set once the engine leads (the node's LeaderReady);
	// from then on every applied entry is one of pending's, in order.
	leading  bool
	promoted bool // Promote returned: the engine takes writes
	lost     error
	term     uint64
	pending  []*siloProposal
	lostCh   chan struct{}
	// proposed counts the bytes of the engine records this member
	// proposed (its entries' data).
	proposed    atomic.Int64
	persistOnly bool
	skipped     atomic.Bool // a persist-only member left a record unapplied
}

type siloProposal struct {
	left int
	done func(uint64, error)
}

// SiloConfig configures a member.
type SiloConfig struct {
	Node   Config
	Engine engine.Config // Follow is set; OpenSink is not used
	// PersistOnly makes a follower keep the log without applying it to
	// its engine: seed 002's setting, where followers only persist. Such
	// a member cannot take over (it stops when elected); for measuring
	// what replication costs apart from the standby's work.
	PersistOnly bool
}

// maxSiloRecord bounds an engine log record, and with it (less 64
// bytes) the largest row: above the storage API's 1 MiB row limit. An
// append message holds up to MaxSizePerMsg of entries plus one, so the
// transport must carry messages of MaxSizePerMsg plus this (LocalSilos
// sets grpcnet's BatchBytes to 4 MiB).
const maxSiloRecord = 2 << 20

// OpenSilo opens a member: its Raft node (Config.Dir) and a follower
// engine (Engine.Dir). Start it with Start once its transport is set
// (Runner().Handler() is what the transport delivers to).
func OpenSilo(cfg SiloConfig) (*Silo, error) {
	if seg := cfg.Node.SegmentSize; seg != 0 && seg < 4*maxSiloRecord {
		return nil, fmt.Errorf("%w: a replicated engine needs raft log segments of at least %d bytes, not %d", ErrConfig, 4*maxSiloRecord, seg)
	}
	ec := cfg.Engine
	ec.Follow = true
	ec.LogBufferSize = min(max(ec.LogBufferSize, 0), maxSiloRecord/4)
	db, err := engine.Open(ec)
	if err != nil {
		return nil, err
	}
	s := &Silo{ecfg: ec, lostCh: make(chan struct{}), persistOnly: cfg.PersistOnly}
	s.db.Store(db)
	s.snaps.init(cfg.Node)
	if s.node, err = Open(cfg.Node, s); err != nil {
		s.snaps.close()
		s.db.Load().Close()
		return nil, err
	}
	// The streams kept that the log's snapshot does not name are not
	// needed.
	first, _ := s.node.store.FirstIndex()
	s.snaps.pruneReceived(first-1, true)
	s.node.SetObserver(s)
	s.node.setSnapshotSender(s.sendSnapshot)
	s.run = NewRunner(s.node)
	s.run.setStreams(s.receiveSnapshot)
	// A node that stops on an error (its log could not be made durable)
	// takes the member with it: what was in flight fails.
	go func() {
		select {
		case <-s.run.Failed():
			s.mu.Lock()
			term := s.term
			s.mu.Unlock()
			s.lose(term)
		case <-s.lostCh:
		}
	}()
	return s, nil
}

// ProposedBytes is the bytes of engine records this member proposed as
// leader: the log it replicated.
func (s *Silo) ProposedBytes() int64 { return s.proposed.Load() }

// Runner is the member's node runner (its Handler feeds the transport's
// messages in).
func (s *Silo) Runner() *Runner { return s.run }

// Node is the member's Raft node; use it only through Runner().Do.
func (s *Silo) Node() *Node { return s.node }

// DB is the member's engine: a follower's refuses writes with
// storage.ErrNotLeader. Installing a snapshot replaces a follower's
// engine (the old one is closed): call DB again rather than keep it.
func (s *Silo) DB() *engine.DB { return s.db.Load() }

// Snapshots counts the snapshots the member sent, received and
// installed.
func (s *Silo) Snapshots() SnapshotStats { return s.snaps.stats() }

func (s *Silo) logf(format string, args ...any) { s.node.cfg.Logf(format, args...) }

// Leading reports whether the member's engine leads and takes writes.
func (s *Silo) Leading() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.promoted && s.lost == nil
}

// Lost is closed when the member's engine lost the leadership it held,
// or its node stopped, or it was closed: the owner closes the member and
// opens it again.
func (s *Silo) Lost() <-chan struct{} { return s.lostCh }

// Start starts the node's loop.
func (s *Silo) Start() { s.run.Start() }

// Close stops the node and closes the engine and the Raft log.
func (s *Silo) Close() error {
	s.mu.Lock()
	if s.lost == nil {
		s.lost = errors.New("replication: member closed")
		close(s.lostCh) // (ends the watch on the node's failure)
	}
	s.mu.Unlock()
	s.snaps.close()
	s.run.Stop()
	s.failPending(&engine.LeadershipLostError{Term: s.term})
	// (A stream being written may wait for a checkpoint's record, which
	// failPending fails.)
	s.snaps.wg.Wait()
	err := s.DB().Close()
	if errors.Is(err, engine.ErrFailed) {
		err = nil // it failed because its proposals did
	}
	return errors.Join(err, s.node.Close())
}

// ---- the state machine (on the node's loop) --------------------------------

// Apply applies a committed entry: an engine record.
func (s *Silo) Apply(index uint64, data []byte) error {
	s.mu.Lock()
	if !s.leading {
		s.mu.Unlock()
		if s.persistOnly {
			s.skipped.Store(true)
			return nil
		}
		return s.DB().Apply(index, data)
	}
	if len(s.pending) == 0 {
		s.mu.Unlock()
		// An entry of this leader's term that it did not propose, or a
		// former one's committed late: the member must start over.
		s.lose(s.term)
		return nil
	}
	p := s.pending[0]
	p.left--
	var done func(uint64, error)
	if p.left == 0 {
		s.pending = s.pending[1:]
		done = p.done
	}
	s.mu.Unlock()
	if done != nil {
		done(index, nil)
	}
	return nil
}

// RoleChanged: a member whose engine leads and sees another leader (or
// none) has lost its office.
func (s *Silo) RoleChanged(leader, term uint64) {
	s.mu.Lock()
	s.term = term
	leading := s.leading
	s.mu.Unlock()
	if leading && leader != s.node.ID() {
		s.lose(term)
	}
}

// LeaderReady: this node leads and has applied everything committed
// before its term; the engine takes over the log.
func (s *Silo) LeaderReady(term uint64) {
	s.mu.Lock()
	if s.leading || s.lost != nil {
		s.mu.Unlock()
		return
	}
	if s.skipped.Load() {
		// Its engine never applied the log: it cannot lead it.
		s.mu.Unlock()
		s.lose(term)
		return
	}
	s.leading, s.term = true, term
	s.mu.Unlock()
	// Promote proposes (and waits for) records, which this loop commits:
	// it runs beside it.
	go func() {
		if err := s.DB().Promote(siloSink{s}); err != nil {
			s.lose(term)
			return
		}
		s.mu.Lock()
		s.promoted = true
		s.mu.Unlock()
	}()
}

// lose records the loss of leadership in term and fails what was in
// flight.
func (s *Silo) lose(term uint64) {
	s.mu.Lock()
	if s.lost != nil {
		s.mu.Unlock()
		return
	}
	s.lost = &engine.LeadershipLostError{Term: term}
	close(s.lostCh)
	s.mu.Unlock()
	s.failPending(&engine.LeadershipLostError{Term: term})
	s.DB().LeadershipLost(term)
}

func (s *Silo) failPending(err error) {
	s.mu.Lock()
	ps := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, p := range ps {
		p.done(0, err)
	}
}

// ---- engine.LogSink --------------------------------------------------------

// siloSink is the engine's view of the member: its LogSink.
type siloSink struct{ s *Silo }

func (k siloSink) MaxRecordSize() int { return maxSiloRecord }

// Propose proposes each record as an entry; done runs once the last is
// committed and applied.
func (k siloSink) Propose(recs [][]byte, done func(uint64, error)) error {
	s := k.s
	s.propMu.Lock()
	defer s.propMu.Unlock()
	s.mu.Lock()
	if s.lost != nil {
		err := s.lost
		s.mu.Unlock()
		return err
	}
	term := s.term
	s.pending = append(s.pending, &siloProposal{left: len(recs), done: done})
	s.mu.Unlock()
	copies := make([][]byte, len(recs))
	n := 0
	for i, r := range recs {
		copies[i] = slices.Clone(r) // Raft keeps them; the engine reuses its buffers
		n += len(r)
	}
	s.proposed.Add(int64(n))
	if err := s.run.Propose(context.Background(), copies...); err != nil {
		// Dropped: no longer the leader (or stopped).
		s.lose(term)
		return &engine.LeadershipLostError{Term: term}
	}
	return nil
}

// Replay is not used: the member's engine follows from the log's start.
func (siloSink) Replay(uint64, func(uint64, []byte) error) error { return nil }

// TruncateFront compacts the Raft log before index: the engine's
// checkpoints stand for it (its records are the entries, index for
// index), and the Raft snapshot says so.
func (k siloSink) TruncateFront(index uint64) error {
	if index <= 1 {
		return nil
	}
	return k.s.compact(index - 1)
}

func (siloSink) Recovered() engine.SinkRecovery { return engine.SinkRecovery{} }

// Close does nothing: the member closes the node (Silo.Close).
func (siloSink) Close() error { return nil }
