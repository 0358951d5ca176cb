package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kiroku-db/kiroku/wal"
)

// logStore is a node's Raft log: raft.MemoryStorage, which the library
// reads, in front of a write-ahead log (package wal) in Dir/raft that makes
// it durable. Every write goes to both, in the order the node's append
// thread receives it; the WAL's callback says when it is durable. At open
// the WAL is replayed into the memory storage.
//
// Records (FORMAT.md):
//
//	entry     = 1 uvarint(index) uvarint(term) uvarint(type) data
//	hardstate = 2 uvarint(term) uvarint(vote) uvarint(commit)
//	snapshot  = 3 uvarint(index) uvarint(term) confstate data
//	compact   = 4 uvarint(index) uvarint(term) confstate data
//	confstate = uvarint(n) uvarint(voter)*n uvarint(n) uvarint(learner)*n
//	            uvarint(n) uvarint(outgoing)*n uvarint(n) uvarint(next learner)*n
//	            byte(auto leave)
//
// An entry record replaces the entries at its index and after (Raft
// overwrites a follower's uncommitted tail). A snapshot record replaces
// the whole log with the snapshot (a follower that installs one); a
// compact record drops the entries up to its index, which a snapshot of
// this node's own state covers, and keeps the rest. The WAL is truncated
// behind the newest compact record after re-appending the current hard
// state, and behind a snapshot record once it is durable with the hard
// state appended with it, so a replay always finds them.
type logStore struct {
	*raft.MemoryStorage
	wal *wal.Log

	mu sync.Mutex
	// batches map Raft indexes to WAL indexes: entries are appended in
	// batches, and compaction truncates the WAL before the batch holding
	// the first entry kept.
	batches []walBatch
}

type walBatch struct {
	first    uint64 // the Raft index of the batch's first entry
	walIndex uint64 // the WAL index of its first record
}

// Record kinds.
const (
	recEntry     byte = 1
	recHardState byte = 2
	recSnapshot  byte = 3
	recCompact   byte = 4
)

// ErrCorruptLog is the cause of a Raft log whose records do not decode or
// contradict each other.
var ErrCorruptLog = errors.New("replication: corrupt raft log")

// openLogStore opens (or creates) the Raft log in dir with the sync policy
// p, and replays it.
func openLogStore(fs vfs.FS, dir string, p wal.Policy, cfg walTuning) (*logStore, error) {
	l, err := wal.Open(wal.Config{Dir: dir, FS: fs, Policy: p, SegmentSize: cfg.segmentSize,
		MaxRecordSize: cfg.maxRecord, MaxPending: cfg.maxPending, Clock: cfg.clock})
	if err != nil {
		return nil, err
	}
	s := &logStore{MemoryStorage: raft.NewMemoryStorage(), wal: l}
	if err := s.replay(); err != nil {
		l.Close()
		return nil, err
	}
	return s, nil
}

// walTuning is what the node passes through to the WAL.
type walTuning struct {
	segmentSize int64
	maxRecord   int
	maxPending  int
	clock       clockwork.Clock
}

func (s *logStore) replay() error {
	var (
		snap    *pb.Snapshot
		entries []pb.Entry
		hs      pb.HardState
		hsSet   bool
	)
	err := s.wal.Scan(s.wal.FirstIndex(), func(at uint64, rec []byte) error {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: record %d: %s", ErrCorruptLog, at, fmt.Sprintf(format, args...))
		}
		if len(rec) == 0 {
			return bad("empty")
		}
		d := decoder{b: rec[1:]}
		switch rec[0] {
		case recEntry:
			e := pb.Entry{Index: d.uvarint(), Term: d.uvarint(), Type: pb.EntryType(d.uvarint())}
			e.Data = d.rest()
			if d.err != nil {
				return bad("entry: %v", d.err)
			}
			if n := len(entries); n > 0 && e.Index > entries[n-1].Index+1 {
				return bad("entry %d after entry %d", e.Index, entries[n-1].Index)
			}
			if n := len(entries); n > 0 && e.Index <= entries[n-1].Index {
				if e.Index < entries[0].Index {
					return bad("entry %d overwrites entry %d, before the first kept", e.Index, entries[0].Index)
				}
				entries = entries[:e.Index-entries[0].Index]
			}
			if len(entries) == 0 && snap != nil && e.Index != snap.Metadata.Index+1 {
				return bad("entry %d after a snapshot at %d", e.Index, snap.Metadata.Index)
			}
			s.notedBatch(e.Index, at)
			entries = append(entries, e)
		case recHardState:
			hs = pb.HardState{Term: d.uvarint(), Vote: d.uvarint(), Commit: d.uvarint()}
			if d.err != nil {
				return bad("hard state: %v", d.err)
			}
			hsSet = true
		case recSnapshot, recCompact:
			idx, term := d.uvarint(), d.uvarint()
			cs := d.confState()
			if d.err != nil {
				return bad("snapshot: %v", d.err)
			}
			m := pb.SnapshotMetadata{Index: idx, Term: term, ConfState: cs}
			if rec[0] == recSnapshot {
				snap = &pb.Snapshot{Metadata: m, Data: d.rest()}
				entries = nil
				s.mu.Lock()
				s.batches = nil // the log before it is gone
				s.mu.Unlock()
				break
			}
			kept := entries[:0]
			for _, e := range entries {
				if e.Index > idx {
					kept = append(kept, e)
				}
			}
			entries = kept
			if snap == nil || snap.Metadata.Index < idx {
				snap = &pb.Snapshot{Metadata: m, Data: d.rest()}
			}
		default:
			return bad("unknown kind %d", rec[0])
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The entries kept must follow the snapshot (or start the log).
	if snap != nil {
		kept := entries[:0]
		for _, e := range entries {
			if e.Index > snap.Metadata.Index {
				kept = append(kept, e)
			}
		}
		entries = kept
	}
	if len(entries) > 0 {
		want := uint64(1)
		if snap != nil {
			want = snap.Metadata.Index + 1
		}
		if entries[0].Index != want {
			return fmt.Errorf("%w: the log's entries start at %d, not %d", ErrCorruptLog, entries[0].Index, want)
		}
	}
	if snap != nil {
		if err := s.MemoryStorage.ApplySnapshot(*snap); err != nil {
			return fmt.Errorf("%w: %v", ErrCorruptLog, err)
		}
	}
	if len(entries) > 0 {
		if err := s.MemoryStorage.Append(entries); err != nil {
			return fmt.Errorf("%w: %v", ErrCorruptLog, err)
		}
	}
	if hsSet {
		if err := s.MemoryStorage.SetHardState(hs); err != nil {
			return fmt.Errorf("%w: %v", ErrCorruptLog, err)
		}
	}
	return nil
}

// notedBatch records that the entry at index begins at WAL record at, if
// it starts a new batch.
func (s *logStore) notedBatch(index, at uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.batches) > 0 && s.batches[len(s.batches)-1].first >= index {
		s.batches = s.batches[:len(s.batches)-1] // overwritten
	}
	s.batches = append(s.batches, walBatch{first: index, walIndex: at})
}

// appendAsync writes what one MsgStorageAppend carries — a snapshot to
// install, entries, a hard state — to memory at once and to the WAL, and
// calls done once the WAL made it durable (or failed), with the WAL index
// of the snapshot's record if there is one and a hard state follows it
// (dropBefore may then drop the WAL before it), else 0. Called from the
// node's one append thread, in message order.
func (s *logStore) appendAsync(snap *pb.Snapshot, entries []pb.Entry, hs *pb.HardState, done func(snapAt uint64, err error)) error {
	var recs [][]byte
	if snap != nil {
		if err := s.MemoryStorage.ApplySnapshot(*snap); err != nil {
			return err
		}
		recs = append(recs, snapshotRecord(recSnapshot, snap.Metadata, snap.Data))
		s.mu.Lock()
		s.batches = nil // the log before it is gone
		s.mu.Unlock()
	}
	if len(entries) > 0 {
		if err := s.MemoryStorage.Append(entries); err != nil {
			return err
		}
		for _, e := range entries {
			recs = append(recs, entryRecord(e))
		}
	}
	if hs != nil {
		if err := s.MemoryStorage.SetHardState(*hs); err != nil {
			return err
		}
		recs = append(recs, hardStateRecord(*hs))
	}
	if len(recs) == 0 {
		done(0, nil)
		return nil
	}
	n := uint64(len(recs))
	first, err := s.wal.AppendAsync(recs, func(last uint64, err error) {
		var at uint64
		if snap != nil && hs != nil && err == nil {
			// (Without a hard state in the batch, the one before the
			// snapshot's record must stay.)
			at = last - n + 1
		}
		done(at, err)
	})
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		at := first
		if snap != nil {
			at++
		}
		s.notedBatch(entries[0].Index, at)
	}
	return nil
}

// compact drops the log up to index, which the snapshot data of this
// node's state covers (cs its configuration then), and truncates the WAL behind
// it: a compact record and the current hard state are appended first, so
// a replay finds them, then the WAL before the batch that holds the first
// entry kept goes.
func (s *logStore) compact(index uint64, cs pb.ConfState, data []byte) error {
	term, err := s.MemoryStorage.Term(index)
	if err != nil {
		return err
	}
	hs, _, err := s.MemoryStorage.InitialState()
	if err != nil {
		return err
	}
	if _, err := s.MemoryStorage.CreateSnapshot(index, &cs, data); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
		return err
	}
	if err := s.MemoryStorage.Compact(index); err != nil && !errors.Is(err, raft.ErrCompacted) {
		return err
	}
	m := pb.SnapshotMetadata{Index: index, Term: term, ConfState: cs}
	done := make(chan error, 1)
	if _, err := s.wal.AppendAsync([][]byte{snapshotRecord(recCompact, m, data), hardStateRecord(hs)}, func(_ uint64, err error) { done <- err }); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	// The batch holding entry index+1 is the last that starts at or
	// before it; the WAL before it is not needed.
	s.mu.Lock()
	k := -1
	for i, b := range s.batches {
		if b.first <= index+1 {
			k = i
		}
	}
	var cut uint64
	if k >= 0 {
		cut = s.batches[k].walIndex
		s.batches = append(s.batches[:0], s.batches[k:]...)
	}
	s.mu.Unlock()
	if cut <= s.wal.FirstIndex() {
		return nil
	}
	return s.wal.TruncateFront(cut)
}

// dropBefore truncates the WAL before index, the record of a snapshot
// installed and durable: replay starts the log over at it.
func (s *logStore) dropBefore(index uint64) error {
	if index <= s.wal.FirstIndex() {
		return nil
	}
	return s.wal.TruncateFront(index)
}

func (s *logStore) close() error { return s.wal.Close() }

// ---- records ---------------------------------------------------------------

func entryRecord(e pb.Entry) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(e.Data))
	b = append(b, recEntry)
	b = binary.AppendUvarint(b, e.Index)
	b = binary.AppendUvarint(b, e.Term)
	b = binary.AppendUvarint(b, uint64(e.Type))
	return append(b, e.Data...)
}

func hardStateRecord(hs pb.HardState) []byte {
	b := []byte{recHardState}
	b = binary.AppendUvarint(b, hs.Term)
	b = binary.AppendUvarint(b, hs.Vote)
	return binary.AppendUvarint(b, hs.Commit)
}

func snapshotRecord(kind byte, m pb.SnapshotMetadata, data []byte) []byte {
	b := []byte{kind}
	b = binary.AppendUvarint(b, m.Index)
	b = binary.AppendUvarint(b, m.Term)
	b = appendConfState(b, m.ConfState)
	return append(b, data...)
}

func appendConfState(b []byte, cs pb.ConfState) []byte {
	for _, ids := range [][]uint64{cs.Voters, cs.Learners, cs.VotersOutgoing, cs.LearnersNext} {
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			b = binary.AppendUvarint(b, id)
		}
	}
	if cs.AutoLeave {
		return append(b, 1)
	}
	return append(b, 0)
}

// decoder reads uvarints; the first failure sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) rest() []byte {
	if d.err != nil || len(d.b) == 0 {
		return nil
	}
	return append([]byte(nil), d.b...)
}

// maxMembers bounds a decoded configuration's lists.
const maxMembers = 1 << 10

func (d *decoder) confState() pb.ConfState {
	var lists [4][]uint64
	for i := range lists {
		n := d.uvarint()
		if n > maxMembers {
			d.err = fmt.Errorf("%d members", n)
			return pb.ConfState{}
		}
		for range n {
			lists[i] = append(lists[i], d.uvarint())
		}
	}
	auto := false
	if d.err == nil {
		if len(d.b) == 0 {
			d.err = errors.New("truncated configuration")
		} else {
			auto = d.b[0] == 1
			d.b = d.b[1:]
		}
	}
	// No id twice in a list, none 0, and no voter a learner too.
	for i, l := range lists {
		seen := map[uint64]bool{}
		for _, id := range l {
			if id == 0 || seen[id] {
				d.err = fmt.Errorf("member %d twice, or 0", id)
			}
			seen[id] = true
			if i == 1 && slices.Contains(lists[0], id) {
				d.err = fmt.Errorf("member %d both voter and learner", id)
			}
		}
	}
	return pb.ConfState{Voters: lists[0], Learners: lists[1], VotersOutgoing: lists[2], LearnersNext: lists[3], AutoLeave: auto}
}
