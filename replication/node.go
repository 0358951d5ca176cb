package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"sync"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/transport"
)

// StateMachine is what a node applies its committed entries to.
type StateMachine interface {
	// Apply applies the data of the committed entry at index. Entries come
	// in log order, each once per run of the node (a restarted node
	// applies again from its snapshot on). An error is fatal to the node.
	Apply(index uint64, data []byte) error
	// Restore replaces the state with the snapshot data that stands for
	// the log up to index (a follower that fell behind the compacted log,
	// or a node that restarts from its own compaction).
	Restore(index uint64, data []byte) error
}

// Observer hears of a node's role, on the goroutine driving the node.
type Observer interface {
	// RoleChanged: the leader the node knows (0: none) or its term
	// changed.
	RoleChanged(leader, term uint64)
	// LeaderReady: the node leads term and has applied every entry
	// committed before it (its own first entry of the term is applied).
	LeaderReady(term uint64)
}

// MembershipObserver, if the Observer also is one, hears of each
// membership change as it is applied, with the change's context (what
// its proposer attached: kiroku puts the new member's address there).
type MembershipObserver interface {
	MembershipChanged(cc pb.ConfChangeV2)
}

// Node is one member of a Raft group: raft.RawNode with asynchronous
// storage writes, driven by one goroutine at a time (Run's, or a
// simulation's), its log in a wal.Log whose policy batches fsyncs (seed
// 001's follower bulk fsync), its messages on a transport.
//
// The driving goroutine calls Tick, Step, Propose and Process. Process
// handles everything ready: messages to peers go out at once; appends go
// to the log, and the responses that promise durability (the node's own
// MsgStorageAppendResp, MsgAppResp to the leader, votes) wait for the
// fsync that covers them — the log's callback queues them and a later
// Process delivers them; committed entries are applied to the state
// machine in order.
type Node struct {
	cfg   Config
	rn    *raft.RawNode
	store *logStore
	sm    StateMachine
	tr    transport.Transport

	// done holds the responses of durable appends, in append order, for
	// the next Process; wake is nudged when it fills. inflight counts the
	// appends not yet durable.
	doneMu   sync.Mutex
	doneQ    []completion
	inflight int
	settled  *sync.Cond
	wake     chan struct{}

	obs      Observer
	applier  func(applyJob) // setApplier; nil applies on the driving goroutine
	applying int            // jobs handed to the applier and not yet finished
	// reads are the ReadIndex requests waiting: by request context until
	// the leader confirms an index, then (ready) until it is applied.
	// reads are keyed by their sequence number, the request context; at
	// most maxReads wait, the oldest failing first, and a change of leader
	// or term fails them all (raft drops them then).
	reads     map[uint64]func(uint64, error)
	readReady []readWait
	readSeq   uint64
	readLow   uint64 // no read below it waits
	failed    error
	applied   uint64
	confState pb.ConfState // as of applied
	// confs are the configurations after each conf change applied above
	// the log's snapshot, in index order; confBase is the snapshot's. A
	// compaction needs the configuration as of its index (confStateAt).
	confs    []confAt
	confBase pb.ConfState
	// compactions wait for their index to be applied (Compact).
	compactions []compaction
	// sendSnap, if set, sends the MsgSnap messages Raft makes (a Silo
	// streams its engine's snapshot: setSnapshotSender); it reports each
	// one's outcome with reportSnapshot, on the driving goroutine.
	sendSnap func(pb.Message)
	soft     raft.SoftState
	term     uint64
}

type completion struct {
	snap   *pb.Snapshot // a snapshot the append installed: restore it now
	snapAt uint64       // the WAL index of its record
	resps  []pb.Message
	err    error
}

type confAt struct {
	index uint64
	cs    pb.ConfState
}

type compaction struct {
	index uint64
	data  []byte
	done  func(error) // nil: nobody waits
}

// ErrBadSnapshot is the cause of a snapshot refused: one the state
// machine could not restore, or (SnapshotError) a snapshot stream a
// member refused on receipt.
var ErrBadSnapshot = errors.New("replication: bad snapshot")

// badSnapshot is the error of a snapshot the state machine could not
// restore: an ErrBadSnapshot.
func badSnapshot(index uint64, err error) error {
	if errors.Is(err, ErrBadSnapshot) {
		return err // it says so, and where
	}
	return fmt.Errorf("%w at %d: %w", ErrBadSnapshot, index, err)
}

// ErrStopped is the cause of every call on a node that failed (its log
// could not be made durable) or was closed.
var ErrStopped = errors.New("replication: node stopped")

// Open opens the node's log in cfg.Dir/raft, restores sm from the log's
// snapshot if it has one, and readies the node. tr may be nil until
// SetTransport: a node's handler must exist before its transport joins.
func Open(cfg Config, sm StateMachine) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The directory's own entry must survive a crash, like the log in it.
	if err := cfg.FS.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	if err := vfsutil.SyncDir(cfg.FS, cfg.FS.PathDir(cfg.Dir)); err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	if err := checkIdentity(cfg.FS, cfg.Dir, &cfg); err != nil {
		return nil, err
	}
	store, err := openLogStore(cfg.FS, cfg.FS.PathJoin(cfg.Dir, "raft"), cfg.Sync, walTuning{segmentSize: cfg.SegmentSize,
		maxRecord: int(min(cfg.SegmentSize-64, 64<<20)), maxPending: 256 << 20, clock: cfg.Clock})
	if err != nil {
		return nil, fmt.Errorf("replication: opening the raft log: %w", err)
	}
	n := &Node{cfg: cfg, store: store, sm: sm, wake: make(chan struct{}, 1)}
	n.settled = sync.NewCond(&n.doneMu)
	snap, err := store.Snapshot()
	if err != nil {
		store.close()
		return nil, err
	}
	_, n.confState, _ = store.InitialState()
	n.confBase = n.confState
	rc := &raft.Config{ID: cfg.ID, ElectionTick: cfg.ElectionTicks, HeartbeatTick: cfg.HeartbeatTicks, Storage: store,
		MaxSizePerMsg: cfg.MaxSizePerMsg, MaxInflightMsgs: cfg.MaxInflightMsgs, MaxUncommittedEntriesSize: cfg.MaxUncommittedEntriesSize,
		PreVote: cfg.PreVote, CheckQuorum: cfg.CheckQuorum, AsyncStorageWrites: true, Applied: snap.Metadata.Index,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}}
	if n.rn, err = newRawNode(rc); err != nil {
		store.close()
		return nil, err
	}
	last, _ := store.LastIndex()
	if last == 0 && raft.IsEmptySnap(snap) && len(cfg.Peers) > 0 {
		peers := make([]raft.Peer, len(cfg.Peers))
		for i, id := range cfg.Peers {
			peers[i] = raft.Peer{ID: id}
		}
		if err := n.rn.Bootstrap(peers); err != nil {
			store.close()
			return nil, fmt.Errorf("replication: %w", err)
		}
	}
	if !raft.IsEmptySnap(snap) {
		if err := sm.Restore(snap.Metadata.Index, snap.Data); err != nil {
			store.close()
			return nil, badSnapshot(snap.Metadata.Index, err)
		}
		n.applied = snap.Metadata.Index
	}
	return n, nil
}

// newRawNode is raft.NewRawNode, with the library's panic over a log it
// finds impossible (a configuration that is not one, say) turned into
// ErrCorruptLog.
func newRawNode(rc *raft.Config) (rn *raft.RawNode, err error) {
	defer func() {
		if r := recover(); r != nil {
			rn, err = nil, fmt.Errorf("%w: raft: %v", ErrCorruptLog, r)
		}
	}()
	rn, err = raft.NewRawNode(rc)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrCorruptLog, err)
	}
	return rn, err
}

// SetObserver sets who hears of the node's role; call it before the
// node is driven.
func (n *Node) SetObserver(o Observer) { n.obs = o }

// SetTransport sets the transport the node sends on.
func (n *Node) SetTransport(tr transport.Transport) { n.tr = tr }

// ID is the node's id.
func (n *Node) ID() uint64 { return n.cfg.ID }

// Tick advances the node's logical clock by one tick.
func (n *Node) Tick() {
	if n.failed != nil {
		return
	}
	defer n.catch()
	n.rn.Tick()
}

// catch turns a panic of the Raft library — which panics when the log it
// is given contradicts what its peers know, e.g. entries a crash lost
// after they were acknowledged — into the node's failure: the node stops
// rather than the process.
func (n *Node) catch() {
	if r := recover(); r != nil {
		n.fail(fmt.Errorf("%w: raft: %v", ErrCorruptLog, r))
	}
}

// Step hands the node a message a peer sent (its wire bytes). Messages
// that do not decode, or that claim to be local, are dropped with an
// error; Raft tolerates lost messages.
func (n *Node) Step(b []byte) (err error) {
	if n.failed != nil {
		return n.failed
	}
	defer func() {
		if err == nil {
			err = n.failed
		}
	}()
	defer n.catch() // (recover works only called by the deferred function itself)
	var m pb.Message
	if err := m.Unmarshal(b); err != nil {
		return fmt.Errorf("replication: a message that does not decode: %w", err)
	}
	if raft.IsLocalMsg(m.Type) || raft.IsLocalMsgTarget(m.From) || m.To != n.cfg.ID {
		return fmt.Errorf("replication: a %v message from %d to %d refused", m.Type, m.From, m.To)
	}
	if err := n.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		return err
	}
	return nil
}

// Propose proposes data as a new entry. It returns raft.ErrProposalDropped
// when this node cannot take it (no leader known, a leadership transfer,
// too much uncommitted).
func (n *Node) Propose(data []byte) error {
	if n.failed != nil {
		return n.failed
	}
	defer n.catch()
	return n.rn.Propose(data)
}

// Process delivers the responses of the appends made durable since it
// last ran, then handles each Ready until none is left. Appends it makes
// complete later: their responses wait for a later Process (Woken says
// when). It returns the error that stopped the node, if it did; a stopped
// node sends and acknowledges nothing more.
func (n *Node) Process() (err error) {
	defer func() { err = n.failed }()
	defer n.catch()
	n.deliverDone()
	for n.failed == nil && n.rn.HasReady() {
		rd := n.rn.Ready()
		for _, rs := range rd.ReadStates {
			seq, k := binary.Uvarint(rs.RequestCtx)
			if fn := n.reads[seq]; k > 0 && fn != nil {
				delete(n.reads, seq)
				n.readReady = append(n.readReady, readWait{rs.Index, fn})
			}
		}
		changed := false
		if rd.SoftState != nil {
			if rd.SoftState.Lead != n.soft.Lead || rd.SoftState.RaftState != n.soft.RaftState {
				n.cfg.Logf("replication: node %d: %v, leader %d", n.cfg.ID, rd.SoftState.RaftState, rd.SoftState.Lead)
				changed = true
			}
			n.soft = *rd.SoftState
		}
		if !raft.IsEmptyHardState(rd.HardState) && rd.HardState.Term != n.term {
			n.term = rd.HardState.Term
			changed = true
		}
		if changed {
			n.abortReads(ErrLeaderChanged)
			if n.obs != nil {
				n.obs.RoleChanged(n.soft.Lead, n.term)
			}
		}
		var local []pb.Message
		for _, m := range rd.Messages {
			switch m.To {
			case raft.LocalAppendThread:
				n.appendAsync(m)
			case raft.LocalApplyThread:
				local = append(local, n.apply(m)...)
			default:
				n.send(m)
			}
			if n.failed != nil {
				break
			}
		}
		for _, m := range local {
			n.deliver(m)
		}
		n.serveReads()
	}
	return n.failed
}

// appendAsync writes a MsgStorageAppend to the log; its responses wait
// for the fsync.
func (n *Node) appendAsync(m pb.Message) {
	var hs *pb.HardState
	if m.Term != 0 || m.Vote != 0 || m.Commit != 0 {
		hs = &pb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
	}
	// A snapshot is restored once its record is durable (deliverDone),
	// before the append's responses are delivered: Raft hands out no
	// entry after it until it hears the append is done, so the restore
	// still comes before them; and the state machine may replace what it
	// keeps on disk only once the log says the snapshot is this node's.
	resps := m.Responses
	entries := m.Entries
	if n.cfg.SyncEachEntry && len(entries) > 1 {
		// Every entry but the last on its own, made durable before the
		// next; the last goes with the hard state and the responses.
		for i := range len(entries) - 1 {
			n.appendOne(m.Snapshot, entries[i:i+1], nil, nil)
			m.Snapshot = nil
		}
		entries = entries[len(entries)-1:]
	}
	n.appendOne(m.Snapshot, entries, hs, resps)
}

// appendOne writes a snapshot, entries and a hard state as one batch,
// whose responses wait for its fsync.
func (n *Node) appendOne(snap *pb.Snapshot, entries []pb.Entry, hs *pb.HardState, resps []pb.Message) {
	if n.failed != nil {
		return
	}
	n.doneMu.Lock()
	n.inflight++
	n.doneMu.Unlock()
	err := n.store.appendAsync(snap, entries, hs, func(snapAt uint64, err error) {
		n.doneMu.Lock()
		n.doneQ = append(n.doneQ, completion{snap: snap, snapAt: snapAt, resps: resps, err: err})
		n.inflight--
		n.settled.Broadcast()
		n.doneMu.Unlock()
		select {
		case n.wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		n.doneMu.Lock()
		n.inflight--
		n.settled.Broadcast()
		n.doneMu.Unlock()
		n.fail(fmt.Errorf("appending to the raft log: %w", err))
		return
	}
	if n.cfg.SerialAppends {
		n.WaitAppends()
		n.deliverDone()
	}
}

type readWait struct {
	index uint64
	fn    func(uint64, error)
}

// ErrLeaderChanged is the error of a ReadIndex request that no leader
// can confirm: none is known, or the leader or term changed while it
// waited. The read may be retried.
var ErrLeaderChanged = errors.New("replication: no leader to confirm the read")

// maxReads bounds the ReadIndex requests waiting for confirmation; a
// request whose message was lost is never confirmed, and the oldest go
// first (ErrLeaderChanged).
const maxReads = 4096

// ReadIndex asks the leader for an index that a linearizable read must
// see (raft's ReadIndex: a round of heartbeats, no log write); fn is
// called on the driving goroutine once this node applied it, with the
// index, or with an error: the node stopped, or no leader confirmed it
// (ErrLeaderChanged). A request whose message was lost under a stable
// leader waits until maxReads newer ones push it out; the caller bounds
// its wait.
func (n *Node) ReadIndex(fn func(index uint64, err error)) {
	switch {
	case n.failed != nil:
		fn(0, n.failed)
		return
	case n.soft.Lead == 0:
		fn(0, ErrLeaderChanged)
		return
	}
	if n.reads == nil {
		n.reads = map[uint64]func(uint64, error){}
	}
	n.readSeq++
	n.reads[n.readSeq] = fn
	for ; len(n.reads) > maxReads; n.readLow++ {
		if old := n.reads[n.readLow]; old != nil {
			delete(n.reads, n.readLow)
			old(0, ErrLeaderChanged)
		}
	}
	defer n.catch()
	n.rn.ReadIndex(binary.AppendUvarint(nil, n.readSeq))
}

// abortReads fails every read waiting for confirmation with err.
func (n *Node) abortReads(err error) {
	for seq, fn := range n.reads {
		delete(n.reads, seq)
		fn(0, err)
	}
	n.readLow = n.readSeq + 1
}

// serveReads calls the reads whose index is applied.
func (n *Node) serveReads() {
	kept := n.readReady[:0]
	for _, r := range n.readReady {
		if r.index <= n.applied {
			r.fn(r.index, nil)
		} else {
			kept = append(kept, r)
		}
	}
	n.readReady = kept
}

// TransferLeader asks the leader to hand its office to node to.
func (n *Node) TransferLeader(to uint64) { n.rn.TransferLeader(to) }

// ProposeConfChange proposes a membership change: adding a learner, a
// voter (or promoting a learner), removing a node. It takes effect when
// committed and applied.
func (n *Node) ProposeConfChange(cc pb.ConfChange) error {
	if n.failed != nil {
		return n.failed
	}
	defer n.catch()
	return n.rn.ProposeConfChange(cc)
}

// ConfState is the membership as of the last entry applied.
func (n *Node) ConfState() pb.ConfState { return n.confState }

// deliverDone delivers the responses of the appends made durable since
// the last call, in order, and reports whether there were any.
func (n *Node) deliverDone() bool {
	n.doneMu.Lock()
	q := n.doneQ
	n.doneQ = nil
	n.doneMu.Unlock()
	for _, c := range q {
		if c.err != nil {
			// An fsync that failed is never retried: what it covered may
			// be lost, so nothing it covered may be acknowledged.
			n.fail(fmt.Errorf("making the raft log durable: %w", c.err))
			return true
		}
		if c.snap != nil {
			// On the applier, after what it has queued, if there is one.
			job := applyJob{snap: c.snap}
			if n.applier != nil {
				n.applying++
				n.applier(job)
			} else if n.finishApply(n.applyEntries(job)); n.failed != nil {
				return true
			}
			// The log before the snapshot is not needed any more.
			if err := n.store.dropBefore(c.snapAt); err != nil {
				n.fail(fmt.Errorf("truncating the raft log before a snapshot: %w", err))
				return true
			}
		}
		for _, m := range c.resps {
			n.deliver(m)
		}
	}
	return len(q) > 0
}

// applyJob is one MsgStorageApply: its entries from index from on, and
// leaderTerm, the term this node led when it was handed out (0 if it did
// not lead), which decides whether an empty entry is its own first of
// the term.
type applyJob struct {
	snap       *pb.Snapshot // a snapshot to restore, instead of m's entries
	m          pb.Message
	from       uint64
	leaderTerm uint64
}

// applied is what applying a job did: the conf changes, to apply on the
// driving goroutine, the last index applied, and the error that stopped
// it.
type appliedJob struct {
	job  applyJob
	ccs  []indexedConfChange
	last uint64
	err  error
}

type indexedConfChange struct {
	index uint64
	cc    pb.ConfChangeI
}

// apply applies a MsgStorageApply's committed entries, on this goroutine
// or (SetApplier) on the applier's, and returns the responses to deliver
// now: none if the applier has the job.
func (n *Node) apply(m pb.Message) []pb.Message {
	job := applyJob{m: m, from: n.applied}
	if n.soft.RaftState == raft.StateLeader {
		job.leaderTerm = n.term
	}
	if n.applier != nil {
		n.applying++
		n.applier(job)
		return nil
	}
	res := n.applyEntries(job)
	n.finishApply(res)
	if n.failed != nil {
		return nil
	}
	return m.Responses
}

// applyEntries applies a job's entries to the state machine. It touches
// nothing of the node's but the state machine and the observer's
// LeaderReady, so it may run beside the driving goroutine.
func (n *Node) applyEntries(job applyJob) appliedJob {
	res := appliedJob{job: job, last: job.from}
	if s := job.snap; s != nil {
		if err := n.sm.Restore(s.Metadata.Index, s.Data); err != nil {
			res.err = badSnapshot(s.Metadata.Index, err)
			return res
		}
		res.last = s.Metadata.Index
		return res
	}
	for _, e := range job.m.Entries {
		if e.Index <= job.from {
			continue // in the snapshot restored
		}
		switch e.Type {
		case pb.EntryNormal:
			if len(e.Data) > 0 {
				if err := n.sm.Apply(e.Index, e.Data); err != nil {
					res.err = fmt.Errorf("applying entry %d: %w", e.Index, err)
					return res
				}
			} else if e.Term == job.leaderTerm && n.obs != nil {
				// A new leader's empty entry: everything before it is
				// committed, and now applied.
				n.obs.LeaderReady(e.Term)
			}
		case pb.EntryConfChange, pb.EntryConfChangeV2:
			cc, err := raftpbConfChange(e)
			if err != nil {
				res.err = fmt.Errorf("entry %d: %w", e.Index, err)
				return res
			}
			res.ccs = append(res.ccs, indexedConfChange{e.Index, cc})
		}
		res.last = e.Index
	}
	return res
}

// raftpbConfChange decodes a configuration change entry of either kind.
func raftpbConfChange(e pb.Entry) (pb.ConfChangeI, error) {
	if e.Type == pb.EntryConfChange {
		var cc pb.ConfChange
		err := cc.Unmarshal(e.Data)
		return cc, err
	}
	var cc pb.ConfChangeV2
	err := cc.Unmarshal(e.Data)
	return cc, err
}

// finishApply records an applied job on the driving goroutine: its conf
// changes take effect and its index counts as applied.
func (n *Node) finishApply(res appliedJob) {
	if s := res.job.snap; s != nil && res.err == nil {
		n.confState = s.Metadata.ConfState
		n.confBase, n.confs = s.Metadata.ConfState, nil
		n.applied = s.Metadata.Index
	}
	for _, c := range res.ccs {
		n.confState = *n.rn.ApplyConfChange(c.cc)
		n.confs = append(n.confs, confAt{c.index, n.confState})
		if mo, ok := n.obs.(MembershipObserver); ok {
			mo.MembershipChanged(c.cc.AsV2())
		}
	}
	n.applied = max(n.applied, res.last)
	if res.err != nil {
		n.fail(res.err)
		return
	}
	n.compactApplied()
}

// finishJob records a job the applier finished (setApplier), and
// delivers its responses. Call it on the driving goroutine, in the order
// the jobs were handed out.
func (n *Node) finishJob(res appliedJob) {
	defer n.catch()
	n.applying--
	n.finishApply(res)
	if n.failed != nil {
		return
	}
	for _, m := range res.job.m.Responses {
		n.deliver(m)
	}
	n.serveReads()
}

// setApplier makes the node hand its committed entries to fn instead of
// applying them itself: fn runs them (applyEntries) on a goroutine of its
// own, in order, and hands each result back through finishJob. The driving
// goroutine then stays free for messages and ticks while a large batch
// is applied (with CheckQuorum, a leader whose followers stop answering
// for an election timeout steps down). Call it before the node is driven.
func (n *Node) setApplier(fn func(applyJob)) { n.applier = fn }

// deliver steps a response meant for this node, and sends the others.
func (n *Node) deliver(m pb.Message) {
	if m.To == n.cfg.ID {
		if err := n.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
			n.fail(fmt.Errorf("stepping %v: %w", m.Type, err))
		}
		return
	}
	n.send(m)
}

func (n *Node) send(m pb.Message) {
	if m.Type == pb.MsgSnap && n.sendSnap != nil {
		n.sendSnap(m)
		return
	}
	if n.tr == nil {
		n.rn.ReportUnreachable(m.To)
		return
	}
	b, err := m.Marshal()
	if err == nil {
		err = n.tr.Send(transport.NodeID(m.To), b)
	}
	if m.Type == pb.MsgSnap {
		status := raft.SnapshotFinish
		if err != nil {
			status = raft.SnapshotFailure
		}
		n.rn.ReportSnapshot(m.To, status)
	}
	if err != nil {
		n.rn.ReportUnreachable(m.To)
	}
}

func (n *Node) fail(err error) {
	if n.failed != nil {
		return
	}
	n.failed = fmt.Errorf("%w: node %d: %w", ErrStopped, n.cfg.ID, err)
	n.cfg.Logf("replication: %v", n.failed)
	for _, c := range n.compactions {
		if c.done != nil {
			c.done(n.failed)
		}
	}
	n.compactions = nil
	for _, r := range n.readReady {
		r.fn(0, n.failed)
	}
	n.readReady = nil
	n.abortReads(n.failed)
}

// WaitAppends waits until every append handed to the log is durable (or
// failed); the next Process delivers their responses. A simulation calls
// it to run the log's fsyncs at points it chooses.
func (n *Node) WaitAppends() {
	n.doneMu.Lock()
	for n.inflight > 0 {
		n.settled.Wait()
	}
	n.doneMu.Unlock()
}

// Woken is nudged when an append becomes durable: the driver then calls
// Process.
func (n *Node) Woken() <-chan struct{} { return n.wake }

// Compact drops the log up to index, which the state machine's snapshot
// data covers; a follower behind it is sent a snapshot. The snapshot's
// configuration is the one as of index. If index is not applied yet (the
// state machine may know of an entry before the node has counted it
// applied), the compaction waits until it is, and a failure then stops
// the node. A compaction to an index the log dropped already does
// nothing.
func (n *Node) Compact(index uint64, data []byte) error {
	if index > n.applied {
		n.compactions = append(n.compactions, compaction{index: index, data: data})
		return nil
	}
	return n.compact(index, data)
}

// compactThen is Compact, calling done (on the driving goroutine) once
// the compaction is durable, or with the error that failed it or stopped
// the node.
func (n *Node) compactThen(index uint64, data []byte, done func(error)) {
	if n.failed != nil {
		done(n.failed)
		return
	}
	if index > n.applied {
		n.compactions = append(n.compactions, compaction{index, data, done})
		return
	}
	done(n.compact(index, data))
}

// compactApplied runs the compactions waiting for an index now applied.
func (n *Node) compactApplied() {
	kept := n.compactions[:0]
	for _, c := range n.compactions {
		if c.index > n.applied {
			kept = append(kept, c)
			continue
		}
		err := n.compact(c.index, c.data)
		if c.done != nil {
			c.done(err)
		}
		if err != nil {
			n.fail(fmt.Errorf("compacting the raft log to %d: %w", c.index, err))
			return
		}
	}
	n.compactions = kept
}

func (n *Node) compact(index uint64, data []byte) error {
	if first, _ := n.store.FirstIndex(); index < first {
		return nil
	}
	cs, err := n.confStateAt(index)
	if err != nil {
		return err
	}
	if err := n.store.compact(index, cs, data); err != nil {
		return err
	}
	// The configurations up to index are history now.
	k := 0
	for k < len(n.confs) && n.confs[k].index <= index {
		n.confBase = n.confs[k].cs
		k++
	}
	n.confs = append(n.confs[:0], n.confs[k:]...)
	return nil
}

// confStateAt is the configuration as of index, which must be applied
// and not before the log's snapshot.
func (n *Node) confStateAt(index uint64) (pb.ConfState, error) {
	first, _ := n.store.FirstIndex()
	if index+1 < first || index > n.applied {
		return pb.ConfState{}, fmt.Errorf("replication: the configuration as of %d: the log keeps %d..%d applied", index, first-1, n.applied)
	}
	cs := n.confBase
	for _, c := range n.confs {
		if c.index > index {
			break
		}
		cs = c.cs
	}
	return cs, nil
}

// snapshotMeta is the metadata of a snapshot of the state as of index:
// its term and configuration. index must be applied, and kept in the log
// or its snapshot's.
func (n *Node) snapshotMeta(index uint64) (pb.SnapshotMetadata, error) {
	term, err := n.store.Term(index)
	if err != nil {
		return pb.SnapshotMetadata{}, fmt.Errorf("replication: the term of %d: %w", index, err)
	}
	cs, err := n.confStateAt(index)
	if err != nil {
		return pb.SnapshotMetadata{}, err
	}
	return pb.SnapshotMetadata{Index: index, Term: term, ConfState: cs}, nil
}

// setSnapshotSender makes the node hand the MsgSnap messages Raft makes
// to fn instead of sending them: fn sends the snapshot its own way, and
// reports how it went with reportSnapshot. Call it before the node is
// driven.
func (n *Node) setSnapshotSender(fn func(pb.Message)) { n.sendSnap = fn }

// reportSnapshot tells Raft how sending a snapshot to node to went: nil,
// delivered; an error, not (the node probes the follower again).
func (n *Node) reportSnapshot(to uint64, err error) {
	if n.failed != nil {
		return
	}
	defer n.catch()
	status := raft.SnapshotFinish
	if err != nil {
		status = raft.SnapshotFailure
	}
	n.rn.ReportSnapshot(to, status)
}

// Status is what a node knows of its group.
type Status struct {
	ID, Leader, Term   uint64
	State              raft.StateType
	Commit, Applied    uint64
	FirstIndex, LastIx uint64
	// Voters and Learners are the membership as of Applied.
	Voters, Learners []uint64
	// Match is, on the leader, the highest index known to be in each
	// member's log; nil elsewhere.
	Match map[uint64]uint64
}

// Status returns the node's view of the group.
func (n *Node) Status() Status {
	st := n.rn.BasicStatus()
	first, _ := n.store.FirstIndex()
	last, _ := n.store.LastIndex()
	out := Status{ID: n.cfg.ID, Leader: st.Lead, Term: st.Term, State: st.RaftState, Commit: st.Commit, Applied: n.applied,
		FirstIndex: first, LastIx: last, Voters: slices.Clone(n.confState.Voters), Learners: slices.Clone(n.confState.Learners)}
	if st.RaftState == raft.StateLeader {
		out.Match = map[uint64]uint64{}
		n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) { out.Match[id] = pr.Match })
	}
	return out
}

// Err is the error that stopped the node, or nil.
func (n *Node) Err() error { return n.failed }

// Close closes the node's log, waiting for the appends in flight. The
// driver must have stopped calling the node.
func (n *Node) Close() error {
	if n.failed == nil {
		n.failed = fmt.Errorf("%w: node %d closed", ErrStopped, n.cfg.ID)
	}
	return n.store.close()
}
