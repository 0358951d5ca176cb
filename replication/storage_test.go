package replication

import (
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kiroku-db/kiroku/wal"
)

// TestSnapshotDropsLog: once a snapshot installed from a leader is
// durable with its hard state, the WAL before it goes; replay then gives
// the snapshot, the entries after it and the hard state. Without a hard
// state in its batch, the WAL stays.
func TestSnapshotDropsLog(t *testing.T) {
	fs := vfs.NewMem()
	open := func() *logStore {
		t.Helper()
		s, err := openLogStore(fs, "/raft", wal.BatchPolicy(), walTuning{segmentSize: 1 << 20, maxRecord: 1<<20 - 64, maxPending: 64 << 20,
			clock: clockwork.NewRealClock()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	write := func(snap *pb.Snapshot, ents []pb.Entry, hs *pb.HardState) uint64 {
		t.Helper()
		type result struct {
			at  uint64
			err error
		}
		ch := make(chan result, 1)
		if err := s.appendAsync(snap, ents, hs, func(at uint64, err error) { ch <- result{at, err} }); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.at
	}
	data := make([]byte, 100<<10)
	for i := uint64(1); i <= 40; i++ {
		write(nil, []pb.Entry{{Index: i, Term: 1, Data: data}}, &pb.HardState{Term: 1, Commit: i})
	}
	before := s.wal.FirstIndex()
	cs := pb.ConfState{Voters: []uint64{1, 2, 3}}
	if at := write(&pb.Snapshot{Metadata: pb.SnapshotMetadata{Index: 90, Term: 2, ConfState: cs}, Data: []byte("a")},
		[]pb.Entry{{Index: 91, Term: 2, Data: data}}, nil); at != 0 {
		t.Fatalf("a snapshot without a hard state may drop the WAL before %d", at)
	}
	at := write(&pb.Snapshot{Metadata: pb.SnapshotMetadata{Index: 100, Term: 3, ConfState: cs}, Data: []byte("b")},
		[]pb.Entry{{Index: 101, Term: 3, Data: data}}, &pb.HardState{Term: 3, Vote: 2, Commit: 100})
	if at == 0 {
		t.Fatal("no WAL index for the snapshot's record")
	}
	if err := s.dropBefore(at); err != nil {
		t.Fatal(err)
	}
	if after := s.wal.FirstIndex(); after <= before || after > at {
		t.Fatalf("the WAL starts at %d (was %d), the snapshot's record is %d", after, before, at)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.close()
	snap, _ := s.Snapshot()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	hs, _, _ := s.InitialState()
	if snap.Metadata.Index != 100 || string(snap.Data) != "b" || first != 101 || last != 101 || hs != (pb.HardState{Term: 3, Vote: 2, Commit: 100}) {
		t.Fatalf("replayed: snapshot %d %q, entries %d..%d, %+v", snap.Metadata.Index, snap.Data, first, last, hs)
	}
}

// TestCompactConfState: a compaction's snapshot has the configuration as
// of its index, not the one applied since; and a compaction to an index
// not applied yet waits until it is.
func TestCompactConfState(t *testing.T) {
	n, err := openTestNode(t, vfs.NewMem(), Config{ID: 1, Peers: []uint64{1}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	step := func() {
		t.Helper()
		for range 4 {
			if err := n.Process(); err != nil {
				t.Fatal(err)
			}
			n.WaitAppends()
		}
	}
	for i := 0; i < 100 && n.Status().State != raft.StateLeader; i++ {
		n.Tick()
		step()
	}
	if err := n.Propose([]byte("a")); err != nil {
		t.Fatal(err)
	}
	step()
	before := n.Status().Applied
	if err := n.ProposeConfChange(pb.ConfChange{Type: pb.ConfChangeAddLearnerNode, NodeID: 2}); err != nil {
		t.Fatal(err)
	}
	step()
	if err := n.Propose([]byte("b")); err != nil {
		t.Fatal(err)
	}
	step()
	if got := n.ConfState().Learners; !slices.Equal(got, []uint64{2}) {
		t.Fatalf("learners %v after the change", got)
	}
	if err := n.Compact(before, nil); err != nil {
		t.Fatal(err)
	}
	snap, _ := n.store.Snapshot()
	if cs := snap.Metadata.ConfState; snap.Metadata.Index != before || len(cs.Learners) != 0 || !slices.Equal(cs.Voters, []uint64{1}) {
		t.Fatalf("compacted to %d with %+v; want %d, voter 1 and no learner yet", snap.Metadata.Index, cs, before)
	}
	applied := n.Status().Applied
	if err := n.Compact(applied, nil); err != nil {
		t.Fatal(err)
	}
	if snap, _ = n.store.Snapshot(); !slices.Equal(snap.Metadata.ConfState.Learners, []uint64{2}) {
		t.Fatalf("compacted to %d with %+v; want learner 2", snap.Metadata.Index, snap.Metadata.ConfState)
	}
	// Not applied yet: it waits.
	if err := n.Compact(applied+1, nil); err != nil {
		t.Fatal(err)
	}
	if first, _ := n.store.FirstIndex(); first != applied+1 {
		t.Fatalf("compacted to %d before it was applied", first-1)
	}
	if err := n.Propose([]byte("c")); err != nil {
		t.Fatal(err)
	}
	step()
	if first, _ := n.store.FirstIndex(); n.Status().Applied < applied+1 || first != applied+2 {
		t.Fatalf("applied %d, the log starts at %d: want it compacted to %d", n.Status().Applied, first, applied+1)
	}
}
