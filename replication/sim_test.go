package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/memnet"
	"github.com/kiroku-db/kiroku/wal"
)

// kv is the simulation's state machine: the entries it applied.
type kv struct {
	applied []kvEntry
}

type kvEntry struct {
	Index uint64 `json:"i"`
	Data  string `json:"d"`
}

func (s *kv) Apply(index uint64, data []byte) error {
	if n := len(s.applied); n > 0 && s.applied[n-1].Index >= index {
		return fmt.Errorf("entry %d applied after %d", index, s.applied[n-1].Index)
	}
	s.applied = append(s.applied, kvEntry{index, string(data)})
	return nil
}

func (s *kv) Restore(index uint64, data []byte) error {
	var es []kvEntry
	if len(data) > 0 {
		if err := json.Unmarshal(data, &es); err != nil {
			return err
		}
	}
	if n := len(es); n > 0 && es[n-1].Index > index {
		return fmt.Errorf("a snapshot at %d holds entry %d", index, es[n-1].Index)
	}
	s.applied = es
	return nil
}

func (s *kv) snapshot() []byte {
	b, _ := json.Marshal(s.applied)
	return b
}

// simNode is one member: its filesystem outlives its crashes.
type simNode struct {
	// wrap, if set, wraps the node's filesystem as its node sees it (to
	// inject faults); stopped is the error that stopped it, if it may.
	wrap    func(vfs.FS) vfs.FS
	stopped error
	id      uint64
	peers   []uint64 // its initial peers: nil for a node that joins later
	fs      *vfs.MemFS
	node    *Node
	sm      *kv
	ep      *memnet.Endpoint
}

// Receive, Serve, ReceiveStream: the node's transport handler.
func (s *simNode) Receive(_ transport.NodeID, msgs [][]byte) {
	if s.node == nil {
		return
	}
	for _, m := range msgs {
		s.node.Step(m) // a refused message is a lost one
	}
}

func (s *simNode) Serve(context.Context, transport.NodeID, []byte) ([]byte, error) { return nil, nil }
func (s *simNode) ReceiveStream(context.Context, transport.NodeID, io.Reader) error {
	return nil
}

type sim struct {
	t *testing.T
	// fatalf reports a broken property: t.Fatalf, or a panic that a test
	// expecting the failure recovers.
	fatalf func(format string, args ...any)
	rng    *rand.Rand
	net    *memnet.Network
	nodes  []*simNode
	policy wal.Policy
	peers  []uint64
	// leaders is the leader seen in each term; acked the data a leader
	// applied (its client would have been answered), by data.
	leaders map[uint64]uint64
	acked   map[string]bool
	waiting map[string]uint64 // proposed, by data: the proposer
}

func newSim(t *testing.T, seed uint64, nodes int, policy wal.Policy) *sim {
	net, err := memnet.New(memnet.Config{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, fatalf: t.Fatalf, rng: rand.New(rand.NewPCG(seed, 99)), net: net, policy: policy,
		leaders: map[uint64]uint64{}, acked: map[string]bool{}, waiting: map[string]uint64{}}
	for i := range nodes {
		s.peers = append(s.peers, uint64(i+1))
	}
	for _, id := range s.peers {
		sn := &simNode{id: id, fs: vfs.NewCrashableMem(), peers: s.peers}
		s.nodes = append(s.nodes, sn)
		s.start(sn)
	}
	return s
}

func (s *sim) start(sn *simNode) {
	sn.sm = &kv{}
	var fs vfs.FS = sn.fs
	if sn.wrap != nil {
		fs = sn.wrap(fs)
	}
	sn.stopped = nil
	n, err := Open(Config{ID: sn.id, Peers: sn.peers, Dir: "/n", FS: fs, Clock: s.net.Clock(), PreVote: true, CheckQuorum: true,
		ElectionTicks: 10, HeartbeatTicks: 1, SegmentSize: 1 << 20, Sync: s.policy}, sn.sm)
	if err != nil {
		s.fatalf("node %d: %v", sn.id, err)
	}
	ep, err := s.net.Join(transport.NodeID(sn.id), sn)
	if err != nil {
		s.fatalf("%v", err)
	}
	n.SetTransport(ep)
	sn.node, sn.ep = n, ep
}

// crash stops a node as a power cut would: only what it synced stays.
func (s *sim) crash(sn *simNode) {
	clone := sn.fs.CrashClone(vfs.CrashCloneCfg{})
	sn.ep.Close()
	sn.node.Close()
	sn.node, sn.fs = nil, clone
}

// settle lets every node process until its appends are durable and their
// responses delivered.
func (s *sim) settle() {
	for _, sn := range s.nodes {
		if sn.node == nil || sn.stopped != nil {
			continue
		}
		// Each Process takes exactly the completions of the appends
		// before it: the order of events does not depend on when the
		// log's goroutine ran.
		for range 4 {
			sn.node.WaitAppends()
			if err := sn.node.Process(); err != nil {
				if sn.wrap == nil {
					s.fatalf("node %d: %v", sn.id, err)
				}
				sn.stopped = err // a fault the test injected
				break
			}
		}
	}
	for _, sn := range s.nodes {
		if sn.node == nil {
			continue
		}
		st := sn.node.Status()
		if st.State == raft.StateLeader {
			if l, ok := s.leaders[st.Term]; ok && l != sn.id {
				s.fatalf("two leaders in term %d: %d and %d", st.Term, l, sn.id)
			}
			s.leaders[st.Term] = sn.id
			for _, e := range sn.sm.applied {
				if s.waiting[e.Data] == sn.id {
					s.acked[e.Data] = true
				}
			}
		}
	}
}

func (s *sim) run(steps int, faults, propose bool) {
	const tickEvery = 5 // iterations of 10 ms: a 50 ms tick
	next := 0
	for i := range steps {
		if err := s.net.RunFor(10 * time.Millisecond); err != nil {
			s.fatalf("%v", err)
		}
		if i%tickEvery == 0 {
			for _, sn := range s.nodes {
				if sn.node != nil {
					sn.node.Tick()
				}
			}
		}
		s.settle()
		// A client proposes to whoever leads.
		for _, sn := range s.nodes {
			if propose && sn.node != nil && sn.node.Status().State == raft.StateLeader && s.rng.IntN(3) == 0 {
				data := fmt.Sprint("w", next)
				next++
				if err := sn.node.Propose([]byte(data)); err == nil {
					s.waiting[data] = sn.id
				}
			}
		}
		if !faults {
			continue
		}
		down := 0
		for _, sn := range s.nodes {
			if sn.node == nil {
				down++
			}
		}
		switch r := s.rng.IntN(1000); {
		case r < 8 && 2*(down+1) < len(s.nodes):
			if sn := s.nodes[s.rng.IntN(len(s.nodes))]; sn.node != nil {
				s.crash(sn)
			}
		case r < 16:
			var a, b []transport.NodeID
			for _, sn := range s.nodes {
				if s.rng.IntN(2) == 0 {
					a = append(a, transport.NodeID(sn.id))
				} else {
					b = append(b, transport.NodeID(sn.id))
				}
			}
			s.net.Partition(a, b)
		case r < 30:
			s.net.HealAll()
		case r < 34:
			f := memnet.Faults{Drop: 0.05, Duplicate: 0.05, Reorder: 0.1, DelayMin: time.Millisecond, DelayMax: 5 * time.Millisecond}
			if err := s.net.SetFaults(f); err != nil {
				s.fatalf("%v", err)
			}
		case r < 40:
			s.net.SetFaults(memnet.Faults{})
		case r < 44:
			// Compact a node's log to what it applied.
			sn := s.nodes[s.rng.IntN(len(s.nodes))]
			if sn.node != nil && sn.node.Status().Applied > 0 {
				if err := sn.node.Compact(sn.node.Status().Applied, sn.sm.snapshot()); err != nil {
					s.fatalf("node %d: compact: %v", sn.id, err)
				}
			}
		}
		for _, sn := range s.nodes {
			if sn.node == nil && s.rng.IntN(50) == 0 {
				s.start(sn)
			}
		}
	}
}

// check: committed entries are the same on every node that has them,
// and every acknowledged write is on every node (but those skipped).
func (s *sim) check(skip ...uint64) {
	byIndex := map[uint64]string{}
	for _, sn := range s.nodes {
		if slices.Contains(skip, sn.id) {
			continue
		}
		have := map[string]bool{}
		for _, e := range sn.sm.applied {
			if d, ok := byIndex[e.Index]; ok && d != e.Data {
				s.fatalf("entry %d is %q on node %d and %q elsewhere", e.Index, e.Data, sn.id, d)
			}
			byIndex[e.Index] = e.Data
			have[e.Data] = true
		}
		for d := range s.acked {
			if !have[d] {
				var at uint64
				for i, dd := range byIndex {
					if dd == d {
						at = i
					}
				}
				var near []kvEntry
				for _, e := range sn.sm.applied {
					if e.Index+3 >= at && e.Index <= at+3 {
						near = append(near, e)
					}
				}
				for _, o := range s.nodes {
					last := uint64(0)
					if n := len(o.sm.applied); n > 0 {
						last = o.sm.applied[n-1].Index
					}
					s.t.Logf("node %d: %+v, last applied entry %d, err %v", o.id, o.node.Status(), last, o.node.Err())
				}
				s.fatalf("acknowledged %s (index %d elsewhere) is missing on node %d (applied %d entries; near it: %v)", d, at, sn.id, len(sn.sm.applied), near)
			}
		}
	}
}

func (s *sim) close() {
	for _, sn := range s.nodes {
		if sn.node != nil {
			sn.ep.Close()
			sn.node.Close()
		}
	}
}

// TestSimulatedCluster runs clusters of three and five nodes over the
// in-memory network for many seeds, with message loss, duplication,
// reordering and delay, partitions, crashes that keep only synced bytes,
// and log compaction, then heals everything and checks that no term had
// two leaders, that committed entries agree everywhere, and that every
// write a leader applied is on every node.
func TestSimulatedCluster(t *testing.T) {
	seeds := 12
	if testing.Short() {
		seeds = 3
	}
	for _, nodes := range []int{3, 5} {
		for seed := range uint64(seeds) {
			// (The batch policy never waits on the clock, so the log's
			// fsyncs run whenever the simulation waits for them.)
			policy := wal.BatchPolicy()
			t.Run(fmt.Sprintf("nodes=%d/seed=%d/%v", nodes, seed, policy), func(t *testing.T) {
				s := newSim(t, seed, nodes, policy)
				defer s.close()
				s.run(1500, true, true)
				s.net.HealAll()
				s.net.SetFaults(memnet.Faults{})
				for _, sn := range s.nodes {
					if sn.node == nil {
						s.start(sn)
					}
				}
				s.run(500, false, true)
				s.run(100, false, false) // the last commits reach every node
				s.check()
				if len(s.acked) < 50 {
					t.Fatalf("only %d writes acknowledged: the cluster made no progress", len(s.acked))
				}
				terms := slices.Collect(func(yield func(uint64) bool) {
					for term := range s.leaders {
						if !yield(term) {
							return
						}
					}
				})
				t.Logf("%d writes acknowledged, %d terms with a leader", len(s.acked), len(terms))
			})
		}
	}
}

// simFailure is what fatalf panics with when a failure is expected.
type simFailure string

// TestSimulationCatchesUnsyncedAcks: the same simulation over a log that
// acknowledges appends once written, never fsynced, must find the loss:
// a check fails, or Raft itself finds its log cut short.
func TestSimulationCatchesUnsyncedAcks(t *testing.T) {
	caught := 0
	for seed := range uint64(4) {
		func() {
			defer func() {
				if r := recover(); r != nil {
					caught++
					t.Logf("seed %d: caught: %v", seed, r)
				}
			}()
			s := newSim(t, seed, 3, wal.PeriodicPolicy(time.Hour))
			s.fatalf = func(format string, args ...any) { panic(simFailure(fmt.Sprintf(format, args...))) }
			defer s.close()
			s.run(1500, true, true)
			s.net.HealAll()
			for _, sn := range s.nodes {
				if sn.node == nil {
					s.start(sn)
				}
			}
			s.run(500, false, true)
			s.run(100, false, false)
			s.check()
		}()
	}
	if caught == 0 {
		t.Fatal("no run over an unsynced log failed: the simulation cannot see lost acknowledgements")
	}
}

func (s *sim) leader() *simNode {
	for _, sn := range s.nodes {
		if sn.node != nil && sn.node.Status().State == raft.StateLeader {
			return sn
		}
	}
	s.fatalf("no leader")
	return nil
}

// TestSimulatedMembership: a node joins as a learner and is promoted to
// voter, leadership is handed to it, a founding node is removed, and a
// follower's linearizable read (ReadIndex) sees every write acknowledged
// before it; writes go on throughout and every one acknowledged is on
// every member.
func TestSimulatedMembership(t *testing.T) {
	s := newSim(t, 7, 3, wal.BatchPolicy())
	defer s.close()
	s.run(300, false, true)
	joiner := &simNode{id: 4, fs: vfs.NewCrashableMem()}
	s.nodes = append(s.nodes, joiner)
	s.start(joiner)
	change := func(typ pb.ConfChangeType, id uint64) {
		t.Helper()
		if err := s.leader().node.ProposeConfChange(pb.ConfChange{Type: typ, NodeID: id}); err != nil {
			t.Fatal(err)
		}
		s.run(200, false, true)
	}
	change(pb.ConfChangeAddLearnerNode, 4)
	if cs := s.leader().node.ConfState(); !slices.Contains(cs.Learners, 4) {
		t.Fatalf("node 4 is not a learner: %+v", cs)
	}
	change(pb.ConfChangeAddNode, 4)
	if cs := s.leader().node.ConfState(); !slices.Contains(cs.Voters, 4) || len(cs.Learners) != 0 {
		t.Fatalf("node 4 is not a voter: %+v", cs)
	}
	s.leader().node.TransferLeader(4)
	s.run(200, false, true)
	if l := s.leader(); l.id != 4 {
		t.Fatalf("node %d leads after the transfer to 4", l.id)
	}
	change(pb.ConfChangeRemoveNode, 1)
	if cs := s.leader().node.ConfState(); slices.Contains(cs.Voters, 1) {
		t.Fatalf("node 1 is still a voter: %+v", cs)
	}
	// A read on a follower after these writes sees them.
	var lastAcked uint64
	for _, e := range s.leader().sm.applied {
		if s.acked[e.Data] {
			lastAcked = max(lastAcked, e.Index)
		}
	}
	var readAt uint64
	var readErr error
	follower := s.nodes[1] // node 2
	follower.node.ReadIndex(func(i uint64, err error) { readAt, readErr = i, err })
	s.run(50, false, false)
	if readErr != nil || readAt < lastAcked {
		t.Fatalf("ReadIndex on node 2: %d, %v; the last acknowledged write is at %d", readAt, readErr, lastAcked)
	}
	if st := follower.node.Status(); st.Applied < readAt {
		t.Fatalf("the read was served at %d with %d applied", readAt, st.Applied)
	}
	s.run(200, false, true)
	s.run(100, false, false)
	s.check(1)
}

// TestFsyncFailureNeverAcknowledges: a follower whose fsync fails stops,
// says why, and never acknowledges what the failed fsync covered. With
// the third node down, the leader needs that follower for a majority:
// no write is acknowledged after the failure. Restarted from what it
// synced, with the third node back, the cluster converges and keeps
// every write acknowledged before.
func TestFsyncFailureNeverAcknowledges(t *testing.T) {
	s := newSim(t, 3, 3, wal.BatchPolicy())
	defer s.close()
	s.run(200, false, true)
	leader := s.leader()
	var victim, other *simNode
	for _, sn := range s.nodes {
		switch {
		case sn == leader:
		case victim == nil:
			victim = sn
		default:
			other = sn
		}
	}
	var armed atomic.Bool
	injected := errors.New("injected fsync failure")
	victim.wrap = func(fs vfs.FS) vfs.FS {
		return errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
			if armed.Load() && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
				return injected
			}
			return nil
		}))
	}
	s.crash(victim) // restart it on the failing filesystem
	s.start(victim)
	s.run(100, false, true)
	s.crash(other)
	s.run(20, false, false)
	before := len(s.acked)
	// The victim's next fsync is the one that would make this write
	// durable on it, and let the leader count it.
	if err := s.leader().node.Propose([]byte("after the failure")); err != nil {
		t.Fatal(err)
	}
	s.waiting["after the failure"] = s.leader().id
	armed.Store(true)
	s.run(300, false, true)
	if victim.stopped == nil || !errors.Is(victim.stopped, ErrStopped) || !errors.Is(victim.stopped, injected) {
		t.Fatalf("the follower whose fsync failed: %v, want ErrStopped for the injected failure", victim.stopped)
	}
	if after := len(s.acked); after != before {
		t.Fatalf("%d writes acknowledged after the follower's fsync failed, with no other majority", after-before)
	}
	// It comes back with what it synced, and the third node too.
	armed.Store(false)
	s.crash(victim)
	s.start(victim)
	s.start(other)
	s.run(400, false, true)
	s.run(100, false, false)
	s.check()
	if len(s.acked) <= before {
		t.Fatal("no write acknowledged once the cluster was whole again")
	}
}

// TestReadIndexWithoutLeader: a read no leader can confirm fails at once
// or when the leadership changes, rather than waiting for ever; many
// unconfirmed reads stay bounded.
func TestReadIndexWithoutLeader(t *testing.T) {
	s := newSim(t, 11, 3, wal.BatchPolicy())
	defer s.close()
	var err error
	s.nodes[0].node.ReadIndex(func(_ uint64, e error) { err = e })
	if !errors.Is(err, ErrLeaderChanged) {
		t.Fatalf("a read before any leader: %v, want ErrLeaderChanged", err)
	}
	s.run(200, false, true)
	// Cut a follower off: its reads go unconfirmed, and are dropped
	// once more than maxReads wait.
	var follower *simNode
	for _, sn := range s.nodes {
		if sn != s.leader() {
			follower = sn
		}
	}
	for _, sn := range s.nodes {
		if sn != follower {
			s.net.Cut(transport.NodeID(follower.id), transport.NodeID(sn.id))
		}
	}
	failed := 0
	for range maxReads + 10 {
		follower.node.ReadIndex(func(_ uint64, e error) {
			if errors.Is(e, ErrLeaderChanged) {
				failed++
			}
		})
	}
	if failed != 10 || len(follower.node.reads) != maxReads {
		t.Fatalf("%d reads dropped, %d waiting; want 10 and %d", failed, len(follower.node.reads), maxReads)
	}
	// Cut off, it loses its leader: every waiting read fails.
	s.run(400, false, false)
	if failed != maxReads+10 || len(follower.node.reads) != 0 {
		t.Fatalf("after the follower lost its leader: %d reads failed, %d waiting", failed, len(follower.node.reads))
	}
}
