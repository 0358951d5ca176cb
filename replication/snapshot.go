package replication

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/transport"
)

// Snapshots of a replicated engine (FORMAT.md, "Snapshots").
//
// The leading engine's checkpoint truncates its log before index i+1
// (engine.LogSink.TruncateFront(i+1)): its checkpoint chain and the log
// from i+1 on are its state. Engine records are Raft entries with the
// same indexes, so the member compacts its Raft log to i, and the Raft
// snapshot's data says only "the engine's own checkpoints, to index i"
// (a chain descriptor). A member restarted on such a log reloads the
// chain from its engine's directory (engine.DB.Reinstall) and applies
// the log after i.
//
// A follower behind the compacted log is sent the engine's snapshot
// stream (engine.DB.Snapshot: a fresh checkpoint, then its chain), never
// inside a Raft message: the leader writes it to a file in Dir/snap
// (kept for later sends while it still reaches the log), notes its size
// and SHA-256, and sends, with the transport's SendStream, the MsgSnap
// Raft made — its snapshot rewritten to the index the engine's stream
// stands for (at or after Raft's), that index's term and configuration,
// and a stream descriptor (index, size, SHA-256) as data — followed by
// the stream. The follower checks the message, the size, the SHA-256
// and the engine stream's own framing and checksum
// (engine.CheckSnapshot) as it writes the stream to Dir/snap, syncs it,
// and only then steps the MsgSnap into Raft; a stream that fails any
// check is refused with a *SnapshotError, nothing is kept and Raft never
// sees it (the leader hears the refusal, reports the snapshot failed, and
// tries again later). Raft then installs the snapshot: once its record is
// durable in the Raft log, Restore checks the file's SHA-256 again,
// replaces the follower's engine by a fresh one and installs the stream
// into it (engine.DB.Install); Raft then hands it the entries after the
// snapshot. A restarted member installs it the same way from the file.
//
// The files in Dir/snap: recv-<index>-<checksum> (a stream received;
// kept while the Raft log's snapshot names it), send-<index> (the
// leader's last stream), and *.tmp while they are written. Followers do not compact their own
// logs: a follower's engine keeps its state in memory and writes no
// checkpoints, so its log is all it could restart from.

// Descriptor kinds, the first byte of a Raft snapshot's data.
const (
	// snapChain: the engine's own checkpoint chain stands for the log to
	// the index (a compaction of this member's).
	snapChain byte = 1
	// snapStream: the engine snapshot stream kept in Dir/snap, of the
	// size and SHA-256 given (a snapshot a leader sent).
	snapStream byte = 2
)

const (
	snapDir     = "snap"
	streamMagic = "KRKRSNAP"
	// maxSnapMsg bounds the MsgSnap at a stream's head: its snapshot
	// carries a descriptor and a configuration (at most 4×1,024 ids).
	maxSnapMsg = 1 << 20
	// maxSnapBytes bounds an engine snapshot stream.
	maxSnapBytes = 1 << 40
	// snapRetry is the least time between two attempts to write the
	// engine's snapshot after one failed (each writes a checkpoint).
	snapRetry = time.Second
)

// snapDesc is a Raft snapshot's data.
type snapDesc struct {
	kind  byte
	index uint64
	size  uint64            // snapStream
	sum   [sha256.Size]byte // snapStream: SHA-256 of the stream
}

func (d snapDesc) encode() []byte {
	b := []byte{d.kind}
	b = binary.AppendUvarint(b, d.index)
	if d.kind == snapStream {
		b = binary.AppendUvarint(b, d.size)
		b = append(b, d.sum[:]...)
	}
	return b
}

func decodeSnapDesc(b []byte) (snapDesc, error) {
	var d snapDesc
	if len(b) == 0 {
		return d, errors.New("no descriptor")
	}
	d.kind = b[0]
	dec := decoder{b: b[1:]}
	d.index = dec.uvarint()
	switch d.kind {
	case snapChain:
	case snapStream:
		d.size = dec.uvarint()
		if dec.err == nil {
			if len(dec.b) < sha256.Size {
				dec.err = errors.New("truncated checksum")
			} else {
				copy(d.sum[:], dec.b)
				dec.b = dec.b[sha256.Size:]
			}
		}
		if dec.err == nil && d.size > maxSnapBytes {
			dec.err = fmt.Errorf("a stream of %d bytes", d.size)
		}
	default:
		return d, fmt.Errorf("descriptor of unknown kind %d", d.kind)
	}
	if dec.err == nil && len(dec.b) > 0 {
		dec.err = fmt.Errorf("%d bytes after the descriptor", len(dec.b))
	}
	if dec.err != nil {
		return d, fmt.Errorf("descriptor: %w", dec.err)
	}
	return d, nil
}

// SnapshotError is a snapshot a member refused: a stream a leader sent
// (refused on receipt, before Raft sees it), or what is on this member's
// disk when it restores one (the stream it kept, or its engine's
// checkpoints). It is an ErrBadSnapshot, and errors.Is finds Err's
// causes too: ErrSnapshotChecksum, engine.ErrBadSnapshot, a
// *engine.CorruptionError, engine.ErrLogGap.
type SnapshotError struct {
	Index  uint64 // the Raft index the snapshot stands for; 0 if unknown
	Source string // where it came from: "the stream from node 2", a path
	Err    error  // what is wrong
}

func (e *SnapshotError) Error() string {
	return fmt.Sprintf("replication: bad snapshot at index %d (%s): %v", e.Index, e.Source, e.Err)
}

// Unwrap makes a SnapshotError an ErrBadSnapshot and its Err.
func (e *SnapshotError) Unwrap() []error { return []error{ErrBadSnapshot, e.Err} }

// ErrSnapshotChecksum is the cause of a snapshot stream whose SHA-256 is
// not its descriptor's: damaged in transit or on disk.
var ErrSnapshotChecksum = errors.New("replication: snapshot checksum mismatch")

// SnapshotStats count a member's snapshots since it opened.
type SnapshotStats struct {
	Built     int64 // engine snapshots written for sending (each a checkpoint)
	Sent      int64 // streams sent that a follower took
	Received  int64 // streams received, checked and kept
	Refused   int64 // streams refused on receipt
	Installed int64 // streams installed into the engine (received, or kept and reloaded at open)
	// Reinstalled counts the engine's own checkpoint chains reloaded at
	// open, for a log compacted while the member led.
	Reinstalled int64
	// LastRefused is why the last stream was refused, if one was.
	LastRefused error
}

// snapshots is a member's part in snapshots: the files in Dir/snap, the
// streams it sends and receives.
type snapshots struct {
	fs    vfs.FS
	dir   string
	clock clockwork.Clock
	// ctx ends the sends in flight when the member closes; wg waits for
	// them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	closed      bool
	sending     map[uint64]bool // the peers a stream goes to now
	lastRefused error
	madeDir     bool

	// buildMu serializes the writing of streams to send; it guards spool
	// and failedAt.
	buildMu  sync.Mutex
	spool    *spool
	failedAt time.Time
	// recvMu serializes the streams received.
	recvMu sync.Mutex

	built, sent, received, refused, installed, reinstalled atomic.Int64
	// filter, set by tests, wraps each stream sent (to damage it).
	filter atomic.Pointer[func(io.Reader) io.Reader]
}

// spool is the leader's last engine snapshot stream, in a file.
type spool struct {
	path string
	meta pb.SnapshotMetadata
	desc snapDesc
}

func (sn *snapshots) init(cfg Config) {
	sn.fs, sn.clock = cfg.FS, cfg.Clock
	if sn.fs == nil {
		sn.fs = vfs.Default
	}
	if sn.clock == nil {
		sn.clock = clockwork.NewRealClock()
	}
	sn.dir = sn.fs.PathJoin(cfg.Dir, snapDir)
	sn.ctx, sn.cancel = context.WithCancel(context.Background())
	sn.sending = map[uint64]bool{}
	// What an earlier run was writing, or kept to send, is not needed.
	names, _ := sn.fs.List(sn.dir)
	for _, n := range names {
		if strings.HasSuffix(n, ".tmp") || strings.HasPrefix(n, "send-") {
			sn.fs.Remove(sn.fs.PathJoin(sn.dir, n))
		}
	}
}

// recvPath is where the stream d describes is kept: named by its index
// and checksum, so that another stream for the same index (from another
// leader) never replaces the one a durable snapshot names.
func (sn *snapshots) recvPath(d snapDesc) string {
	return sn.fs.PathJoin(sn.dir, fmt.Sprintf("recv-%020d-%x", d.index, d.sum[:8]))
}

func (sn *snapshots) sendPath(index uint64) string {
	return sn.fs.PathJoin(sn.dir, fmt.Sprintf("send-%020d", index))
}

// mkdir makes Dir/snap, durably, once.
func (sn *snapshots) mkdir() error {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.madeDir {
		return nil
	}
	if err := sn.fs.MkdirAll(sn.dir, 0o755); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	if err := vfsutil.SyncDir(sn.fs, sn.fs.PathDir(sn.dir)); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	sn.madeDir = true
	return nil
}

// pruneReceived removes the received streams below index, the Raft log's
// snapshot (it never goes back to one), and with all those above it too
// (at open: streams whose snapshot never became the log's).
func (sn *snapshots) pruneReceived(index uint64, all bool) {
	names, _ := sn.fs.List(sn.dir)
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, "recv-")
		if !ok || strings.HasSuffix(n, ".tmp") {
			continue // a .tmp: being written
		}
		num, _, _ := strings.Cut(rest, "-")
		i, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			continue
		}
		if i < index || all && i > index {
			sn.fs.Remove(sn.fs.PathJoin(sn.dir, n))
		}
	}
}

// dropSpool removes the leader's last stream if it stands for an index
// before index, the log's compaction: a follower that installed it would
// need entries the log no longer has. A stream being written (which
// compacts the log itself, holding buildMu) replaces it anyway.
func (sn *snapshots) dropSpool(index uint64) {
	if !sn.buildMu.TryLock() {
		return
	}
	defer sn.buildMu.Unlock()
	if sp := sn.spool; sp != nil && sp.meta.Index < index {
		sn.fs.Remove(sp.path) // (a send still reading it has it open)
		sn.spool = nil
	}
}

func (sn *snapshots) close() {
	sn.mu.Lock()
	sn.closed = true
	sn.mu.Unlock()
	sn.cancel()
}

func (sn *snapshots) stats() SnapshotStats {
	sn.mu.Lock()
	last := sn.lastRefused
	sn.mu.Unlock()
	return SnapshotStats{Built: sn.built.Load(), Sent: sn.sent.Load(), Received: sn.received.Load(), Refused: sn.refused.Load(),
		Installed: sn.installed.Load(), Reinstalled: sn.reinstalled.Load(), LastRefused: last}
}

// checkFile checks that the stream at path is the one d describes: its
// size and SHA-256.
func checkFile(fs vfs.FS, path string, d snapDesc) error {
	bad := func(err error) error { return &SnapshotError{Index: d.index, Source: path, Err: err} }
	f, err := fs.Open(path)
	if err != nil {
		return bad(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return bad(err)
	}
	if uint64(n) != d.size {
		return bad(fmt.Errorf("%d bytes, expected %d", n, d.size))
	}
	if sum := h.Sum(nil); !bytes.Equal(sum, d.sum[:]) {
		return bad(fmt.Errorf("%w: SHA-256 %x, expected %x", ErrSnapshotChecksum, sum, d.sum))
	}
	return nil
}

// ---- restoring (the state machine) ----------------------------------------

// Restore replaces the engine by the snapshot the Raft log holds at
// index: at open, or once a snapshot a leader sent is durable in the log.
// A stream received is checked again (size, SHA-256) before the engine is
// touched, then installed into a fresh follower engine, which replaces
// the member's; the engine's own chain (a compaction of this member's) is
// reloaded from its directory. A snapshot that fails is a *SnapshotError,
// and the engine the member had is left as it was if the stream's checks
// failed.
func (s *Silo) Restore(index uint64, data []byte) error {
	d, err := decodeSnapDesc(data)
	if err == nil && d.index != index {
		err = fmt.Errorf("the descriptor stands for index %d", d.index)
	}
	if err != nil {
		return &SnapshotError{Index: index, Source: "the raft log", Err: err}
	}
	if s.persistOnly {
		s.skipped.Store(true) // its engine never holds the log
		return nil
	}
	s.mu.Lock()
	leading := s.leading
	s.mu.Unlock()
	if leading {
		return fmt.Errorf("replication: the member's engine leads: it installs no snapshot (index %d)", index)
	}
	sn := &s.snaps
	switch d.kind {
	case snapChain:
		db, err := s.freshEngine()
		if err != nil {
			return err
		}
		if _, err := db.Reinstall(index); err != nil {
			return &SnapshotError{Index: index, Source: "the engine's checkpoints in " + s.ecfg.Dir, Err: err}
		}
		sn.reinstalled.Add(1)
	case snapStream:
		path := sn.recvPath(d)
		if err := checkFile(sn.fs, path, d); err != nil {
			return err
		}
		f, err := sn.fs.Open(path)
		if err != nil {
			return &SnapshotError{Index: index, Source: path, Err: err}
		}
		defer f.Close()
		db, err := s.freshEngine()
		if err != nil {
			return err
		}
		if _, err := db.Install(f); err != nil {
			return &SnapshotError{Index: index, Source: path, Err: err}
		}
		sn.installed.Add(1)
		sn.pruneReceived(index, false)
	}
	return nil
}

// freshEngine closes the member's engine and opens a new follower on its
// directory, which replaces it (DB).
func (s *Silo) freshEngine() (*engine.DB, error) {
	if err := s.db.Load().Close(); err != nil && !errors.Is(err, engine.ErrFailed) {
		return nil, fmt.Errorf("replication: closing the engine for a snapshot: %w", err)
	}
	db, err := engine.Open(s.ecfg)
	if err != nil {
		return nil, fmt.Errorf("replication: opening the engine for a snapshot: %w", err)
	}
	s.db.Store(db)
	return db, nil
}

// compact compacts the Raft log to index, for which the leading engine's
// checkpoints stand (TruncateFront), and waits until it is durable.
func (s *Silo) compact(index uint64) error {
	done := make(chan error, 1)
	data := snapDesc{kind: snapChain, index: index}.encode()
	if err := s.run.Do(context.Background(), func(n *Node) {
		n.compactThen(index, data, func(err error) { done <- err })
	}); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-s.run.done:
		return s.run.stopped()
	}
	s.snaps.pruneReceived(index, false)
	s.snaps.dropSpool(index)
	return nil
}

// ---- sending (the leader) --------------------------------------------------

// sendSnapshot sends the snapshot of a MsgSnap Raft made, on a goroutine
// of its own, and reports how it went. Called on the node's loop.
func (s *Silo) sendSnapshot(m pb.Message) {
	sn := &s.snaps
	sn.mu.Lock()
	if sn.closed || sn.sending[m.To] {
		// Closing; or a stream goes to the peer already, and will report.
		sn.mu.Unlock()
		return
	}
	sn.sending[m.To] = true
	sn.wg.Add(1)
	sn.mu.Unlock()
	go func() {
		defer sn.wg.Done()
		err := s.streamSnapshot(sn.ctx, m)
		if err != nil && !errors.Is(err, errSnapRetry) {
			s.logf("replication: node %d: a snapshot for node %d: %v", m.From, m.To, err)
		} else {
			sn.sent.Add(1)
		}
		free := func() {
			sn.mu.Lock()
			delete(sn.sending, m.To)
			sn.mu.Unlock()
		}
		// The peer is free for another stream before Raft hears of this
		// one, which may make it ask for another at once.
		if derr := s.run.Do(sn.ctx, func(n *Node) { free(); n.reportSnapshot(m.To, err) }); derr != nil {
			free()
		}
	}()
}

// streamSnapshot sends m's peer the engine's snapshot: the MsgSnap,
// rewritten for it, then the stream.
func (s *Silo) streamSnapshot(ctx context.Context, m pb.Message) error {
	if m.Snapshot == nil {
		return errors.New("a MsgSnap without a snapshot")
	}
	sp, f, err := s.spoolFor(ctx, m.Snapshot.Metadata.Index)
	if err != nil {
		return err
	}
	defer f.Close()
	m.Snapshot = &pb.Snapshot{Metadata: sp.meta, Data: sp.desc.encode()}
	hdr, err := streamHeader(m)
	if err != nil {
		return err
	}
	var r io.Reader = io.MultiReader(bytes.NewReader(hdr), f)
	if fl := s.snaps.filter.Load(); fl != nil {
		r = (*fl)(r)
	}
	if s.node.tr == nil {
		return errors.New("no transport")
	}
	return s.node.tr.SendStream(ctx, transport.NodeID(m.To), r)
}

// streamHeader is what a snapshot stream begins with: the magic and the
// MsgSnap.
func streamHeader(m pb.Message) ([]byte, error) {
	b, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	hdr := binary.AppendUvarint([]byte(streamMagic), uint64(len(b)))
	return append(hdr, b...), nil
}

// spoolFor returns the leader's stream for a follower that needs the log
// from after want (Raft's snapshot index) on, and the stream's file,
// open: the last one written if it reaches that far, else a new one.
func (s *Silo) spoolFor(ctx context.Context, want uint64) (*spool, vfs.File, error) {
	sn := &s.snaps
	sn.buildMu.Lock()
	defer sn.buildMu.Unlock()
	if sp := sn.spool; sp == nil || sp.meta.Index < want {
		if !sn.failedAt.IsZero() && sn.clock.Since(sn.failedAt) < snapRetry {
			return nil, nil, errSnapRetry
		}
		sp, err := s.writeSpool(ctx, want)
		if err != nil {
			sn.failedAt = sn.clock.Now()
			return nil, nil, err
		}
		if old := sn.spool; old != nil {
			sn.fs.Remove(old.path) // (a send still reading it has it open)
		}
		sn.spool = sp
	}
	f, err := sn.fs.Open(sn.spool.path)
	if err != nil {
		return nil, nil, err
	}
	return sn.spool, f, nil
}

// writeSpool writes the leading engine's snapshot (a checkpoint, then its
// chain) to Dir/snap/send-<index>, with its size and SHA-256.
func (s *Silo) writeSpool(ctx context.Context, want uint64) (*spool, error) {
	sn := &s.snaps
	if err := sn.mkdir(); err != nil {
		return nil, err
	}
	tmp := sn.fs.PathJoin(sn.dir, "send.tmp")
	f, err := sn.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	h := sha256.New()
	var n countWriter
	meta, err := s.DB().Snapshot(ctx, io.MultiWriter(f, h, &n))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	fail := func(err error) (*spool, error) {
		sn.fs.Remove(tmp)
		return nil, err
	}
	if err != nil {
		return fail(fmt.Errorf("the engine's snapshot: %w", err))
	}
	if meta.Index < want {
		return fail(fmt.Errorf("the engine's snapshot stands for index %d, before the log's compaction to %d", meta.Index, want))
	}
	var rm pb.SnapshotMetadata
	var merr error
	if err := s.run.Do(ctx, func(n *Node) { rm, merr = n.snapshotMeta(meta.Index) }); err != nil {
		return fail(err)
	}
	if merr != nil {
		return fail(merr)
	}
	path := sn.sendPath(meta.Index)
	if err := sn.fs.Rename(tmp, path); err != nil {
		return fail(err)
	}
	sn.built.Add(1)
	d := snapDesc{kind: snapStream, index: meta.Index, size: uint64(n)}
	h.Sum(d.sum[:0])
	return &spool{path: path, meta: rm, desc: d}, nil
}

// errSnapRetry refuses a snapshot asked for within snapRetry of a failed
// attempt to write one.
var errSnapRetry = errors.New("replication: the last attempt to write the engine's snapshot failed; not yet again")

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

// ---- receiving (a follower) ------------------------------------------------

// receiveSnapshot takes a snapshot stream from a peer (the transport's
// ReceiveStream): it keeps the stream once every check passes, and then
// steps its MsgSnap into Raft. An error refuses it.
func (s *Silo) receiveSnapshot(ctx context.Context, from transport.NodeID, r io.Reader) error {
	sn := &s.snaps
	sn.recvMu.Lock()
	defer sn.recvMu.Unlock()
	err := s.receive(ctx, uint64(from), r)
	if err != nil {
		sn.refused.Add(1)
		sn.mu.Lock()
		sn.lastRefused = err
		sn.mu.Unlock()
		s.logf("replication: node %d: refused a snapshot from node %d: %v", s.node.ID(), from, err)
	}
	return err
}

func (s *Silo) receive(ctx context.Context, from uint64, r io.Reader) error {
	sn := &s.snaps
	src := fmt.Sprintf("the stream from node %d", from)
	var index uint64
	bad := func(format string, args ...any) error {
		return &SnapshotError{Index: index, Source: src, Err: fmt.Errorf(format, args...)}
	}
	br := bufio.NewReaderSize(r, 64<<10)
	magic := make([]byte, len(streamMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != streamMagic {
		return bad("not a snapshot stream")
	}
	size, err := binary.ReadUvarint(br)
	if err != nil || size == 0 || size > maxSnapMsg {
		return bad("a message of %d bytes (%v)", size, err)
	}
	mb := make([]byte, size)
	if _, err := io.ReadFull(br, mb); err != nil {
		return bad("the message cut short")
	}
	var m pb.Message
	if err := m.Unmarshal(mb); err != nil {
		return bad("the message does not decode: %v", err)
	}
	if m.Type != pb.MsgSnap || m.Snapshot == nil || m.From != from || m.To != s.node.ID() {
		return bad("a %v from %d to %d (with a snapshot: %v)", m.Type, m.From, m.To, m.Snapshot != nil)
	}
	index = m.Snapshot.Metadata.Index
	d, err := decodeSnapDesc(m.Snapshot.Data)
	if err == nil && (d.kind != snapStream || d.index != index || index == 0) {
		err = fmt.Errorf("a descriptor of kind %d at index %d", d.kind, d.index)
	}
	if err != nil {
		return bad("%v", err)
	}
	if err := sn.mkdir(); err != nil {
		return err
	}
	path := sn.recvPath(d)
	tmp := path + ".tmp"
	f, err := sn.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	kept := false
	defer func() {
		if !kept {
			f.Close()
			sn.fs.Remove(tmp)
		}
	}()
	// The stream is written, hashed, counted and checked by the engine as
	// it is read; what the engine leaves unread still counts.
	h := sha256.New()
	var n countWriter
	var rerr error
	body := io.TeeReader(&errReader{r: io.LimitReader(br, int64(d.size)), err: &rerr}, io.MultiWriter(f, h, &n))
	meta, cerr := engine.CheckSnapshot(body)
	if _, err := io.Copy(io.Discard, body); err != nil && rerr == nil {
		rerr = err // the file's write
	}
	if rerr != nil {
		// Not the stream's fault: the sender gave up, or the disk failed.
		return fmt.Errorf("replication: receiving the snapshot at %d from node %d: %w", index, from, rerr)
	}
	if uint64(n) != d.size {
		return bad("%d bytes, expected %d", n, d.size)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		if err != nil {
			return fmt.Errorf("replication: receiving the snapshot at %d from node %d: %w", index, from, err)
		}
		return bad("bytes after the snapshot")
	}
	if sum := h.Sum(nil); !bytes.Equal(sum, d.sum[:]) {
		return &SnapshotError{Index: index, Source: src, Err: fmt.Errorf("%w: SHA-256 %x, expected %x", ErrSnapshotChecksum, sum, d.sum)}
	}
	if cerr != nil {
		return &SnapshotError{Index: index, Source: src, Err: cerr}
	}
	if meta.Index != index {
		return bad("the engine's snapshot stands for index %d", meta.Index)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	kept = true
	if err := f.Close(); err != nil {
		sn.fs.Remove(tmp)
		return fmt.Errorf("replication: %w", err)
	}
	if err := sn.fs.Rename(tmp, path); err != nil {
		sn.fs.Remove(tmp)
		return fmt.Errorf("replication: %w", err)
	}
	if err := vfsutil.SyncDir(sn.fs, sn.dir); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	sn.received.Add(1)
	// Raft takes it from here: it installs the snapshot (Restore) once
	// its log holds it, or ignores it if it has the entries by now. (A
	// stream it ignores stays until a later snapshot or compaction, or
	// the next open, prunes it: until the snapshot's record is durable,
	// the one before it may still be needed.)
	var serr error
	if err := s.run.Do(ctx, func(n *Node) { serr = n.Step(mb) }); err != nil {
		return err
	}
	return serr
}

// errReader passes r's reads on, noting an error that is not io.EOF in
// *err: the engine reports a short stream, and the caller must tell it
// from a read that failed.
type errReader struct {
	r   io.Reader
	err *error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && *e.err == nil {
		*e.err = err
	}
	return n, err
}
