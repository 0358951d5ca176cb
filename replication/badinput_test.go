package replication

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kiroku-db/kiroku/wal"
)

func openTestNode(t testing.TB, fs vfs.FS, cfg Config) (*Node, error) {
	t.Helper()
	cfg.FS, cfg.Dir, cfg.SegmentSize = fs, "/n", 1<<20
	return Open(cfg, &kv{})
}

// TestWrongDirectory: a directory of another cluster or member, a peer
// list that disagrees with the cluster's, a log without an identity, and
// configs that cannot work are refused with typed errors before anything
// is read.
func TestWrongDirectory(t *testing.T) {
	fs := vfs.NewMem()
	n, err := openTestNode(t, fs, Config{ID: 1, ClusterID: "a", Peers: []uint64{1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Process(); err != nil {
		t.Fatal(err)
	}
	n.WaitAppends()
	n.Close()
	for _, c := range []struct {
		name string
		cfg  Config
		want error
	}{
		{"another cluster", Config{ID: 1, ClusterID: "b", Peers: []uint64{1, 2, 3}}, ErrWrongCluster},
		{"another member", Config{ID: 2, ClusterID: "a", Peers: []uint64{1, 2, 3}}, ErrWrongCluster},
		{"other peers", Config{ID: 1, ClusterID: "a", Peers: []uint64{1, 2}}, ErrPeersMismatch},
		{"node not among its peers", Config{ID: 4, ClusterID: "a", Peers: []uint64{1, 2, 3}}, ErrConfig},
		{"a peer twice", Config{ID: 1, ClusterID: "a", Peers: []uint64{1, 1, 3}}, ErrConfig},
		{"election not above heartbeat", Config{ID: 1, ClusterID: "a", ElectionTicks: 2, HeartbeatTicks: 2}, ErrConfig},
		{"tiny messages", Config{ID: 1, ClusterID: "a", MaxSizePerMsg: 10}, ErrConfig},
	} {
		if _, err := openTestNode(t, fs, c.cfg); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// The same member, restarted with or without its peer list, opens.
	for _, peers := range [][]uint64{{3, 2, 1}, nil} {
		n, err := openTestNode(t, fs, Config{ID: 1, ClusterID: "a", Peers: peers})
		if err != nil {
			t.Fatalf("peers %v: %v", peers, err)
		}
		n.Close()
	}
	// A raft log without an identity is not one a node made.
	if err := fs.Remove("/n/" + identityFile); err != nil {
		t.Fatal(err)
	}
	if _, err := openTestNode(t, fs, Config{ID: 1, ClusterID: "a", Peers: []uint64{1, 2, 3}}); !errors.Is(err, ErrWrongCluster) {
		t.Fatalf("a log without an identity: %v, want ErrWrongCluster", err)
	}
}

// TestCorruptRaftLog: records that do not decode, or that contradict
// each other, fail the open with ErrCorruptLog; damage to the bytes of a
// synced record is the WAL's CorruptionError.
func TestCorruptRaftLog(t *testing.T) {
	bad := map[string][][]byte{
		"unknown kind":     {{9, 1, 2}},
		"empty record":     {{}},
		"truncated entry":  {{recEntry, 0x80}},
		"a gap":            {entryRecord(pb.Entry{Index: 1, Term: 1}), entryRecord(pb.Entry{Index: 3, Term: 1})},
		"overwrite before": {snapshotRecord(recCompact, pb.SnapshotMetadata{Index: 5, Term: 1}, nil), entryRecord(pb.Entry{Index: 6, Term: 1}), entryRecord(pb.Entry{Index: 7, Term: 1}), entryRecord(pb.Entry{Index: 2, Term: 1})},
		"too many members": {append([]byte{recSnapshot, 1, 1}, 0xff, 0xff, 0x03)},
	}
	for name, recs := range bad {
		t.Run(name, func(t *testing.T) {
			fs := raftLogOf(t, recs...)
			if _, err := openTestNode(t, fs, Config{ID: 1}); !errors.Is(err, ErrCorruptLog) {
				t.Fatalf("%v, want ErrCorruptLog", err)
			}
		})
	}
}

// FuzzRaftLog replays arbitrary records as a node's Raft log: the node
// opens, or is refused with ErrCorruptLog (or ErrBadSnapshot, a snapshot
// its state machine cannot restore); it never panics.
func FuzzRaftLog(f *testing.F) {
	f.Add(entryRecord(pb.Entry{Index: 1, Term: 1, Data: []byte("x")}), hardStateRecord(pb.HardState{Term: 1, Commit: 1}))
	f.Add(snapshotRecord(recSnapshot, pb.SnapshotMetadata{Index: 4, Term: 2, ConfState: pb.ConfState{Voters: []uint64{1}}}, []byte("[]")),
		entryRecord(pb.Entry{Index: 5, Term: 2}))
	f.Add(snapshotRecord(recCompact, pb.SnapshotMetadata{Index: 4, Term: 2}, nil), []byte{recEntry, 1, 1})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var recs [][]byte
		for _, r := range [][]byte{a, b} {
			if len(r) > 0 {
				recs = append(recs, r)
			}
		}
		fs := raftLogOf(t, recs...)
		n, err := openTestNode(t, fs, Config{ID: 1})
		if err != nil {
			if !errors.Is(err, ErrCorruptLog) && !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("untyped: %v", err)
			}
			return
		}
		n.Process()
		n.WaitAppends()
		n.Close()
	})
}

// FuzzStep hands a node arbitrary message bytes: it takes them, refuses
// them, or stops (ErrCorruptLog, when Raft finds them impossible); the
// process never panics.
func FuzzStep(f *testing.F) {
	for _, m := range []pb.Message{
		{Type: pb.MsgHeartbeat, From: 2, To: 1, Term: 5, Commit: 3},
		{Type: pb.MsgApp, From: 2, To: 1, Term: 2, Index: 0, LogTerm: 0, Entries: []pb.Entry{{Index: 1, Term: 2, Data: []byte("x")}}, Commit: 1},
		{Type: pb.MsgVote, From: 3, To: 1, Term: 9, Index: 7, LogTerm: 4},
		{Type: pb.MsgSnap, From: 2, To: 1, Term: 3, Snapshot: &pb.Snapshot{Metadata: pb.SnapshotMetadata{Index: 9, Term: 3, ConfState: pb.ConfState{Voters: []uint64{1, 2}}}}},
	} {
		b, err := m.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := openTestNode(t, vfs.NewMem(), Config{ID: 1, Peers: []uint64{1, 2, 3}})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if err := n.Process(); err != nil {
			t.Fatal(err)
		}
		n.WaitAppends()
		n.Step(b)
		if err := n.Process(); err != nil && !errors.Is(err, ErrCorruptLog) {
			t.Fatalf("untyped: %v", err)
		}
		n.WaitAppends()
	})
}

// raftLogOf makes a node's directory whose Raft log holds recs, exactly.
func raftLogOf(t *testing.T, recs ...[]byte) vfs.FS {
	t.Helper()
	fs := vfs.NewMem()
	n, err := openTestNode(t, fs, Config{ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	l, err := wal.Open(wal.Config{Dir: "/n/raft", FS: fs, Policy: wal.BatchPolicy(), SegmentSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, r := range recs {
		if _, err := l.Append(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	return fs
}
