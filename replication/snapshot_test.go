package replication

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/transport"
)

// TestSiloSnapshot: of three members one is stopped, and the leader
// writes and checkpoints until its Raft log is compacted past the stopped
// member's. Restarted, the member needs a snapshot. While the leader
// damages its streams, the member refuses each with a typed error and
// its engine stays as it was; so does a stream whose checksum was forged
// to match. Once the streams are whole, the member installs one and then
// holds exactly the leader's rows, and the log after the snapshot.
// Restarted, it comes back from the snapshot it kept and the log after
// it, and refuses to open on a kept snapshot damaged on disk. Made
// leader, it has everything and takes writes; the old leader, reopened as
// a follower, reloads the checkpoints it wrote while it led.
func TestSiloSnapshot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// A 50 ms tick (elections after 0.5 s of silence): the test needs one
	// leader throughout, and a busy machine stalls a process for longer than
	// a 10 ms tick's election timeout.
	c, err := StartLocalSilos(3, dir, Config{TickInterval: 50 * time.Millisecond, PreVote: true, CheckQuorum: true, SegmentSize: 8 << 20},
		engine.Config{EpochInterval: 2 * time.Millisecond, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lid, leader, err := c.Leader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{leader.DB().CreateNamespace(ctx, "s"), leader.DB().CreateTable(ctx, siloTable)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// model is every key written, with its value; "" once deleted.
	model := map[string]string{}
	write := func(s *Silo, round, n int) {
		t.Helper()
		for i := range n {
			k := fmt.Sprintf("k%d", (round*n+i)%(3*n)) // later rounds overwrite earlier keys
			var err error
			if i%7 == 3 {
				err = s.DB().Delete(ctx, &storage.Delete{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)}})
				model[k] = ""
			} else {
				v := fmt.Sprintf("r%d-%d", round, i)
				err = s.DB().Put(ctx, &storage.Put{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)},
					Values: storage.Values{"v": storage.Text(v)}})
				model[k] = v
			}
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, k, err)
			}
		}
	}
	write(leader, 0, 100)

	var fid uint64
	for _, id := range c.Peers() {
		if id != lid {
			fid = id
			break
		}
	}
	fst, err := c.Member(fid).Runner().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(fid); err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 3; round++ {
		write(leader, round, 100)
		if _, err := leader.DB().Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lst, err := leader.Runner().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lst.FirstIndex <= fst.LastIx+1 {
		t.Fatalf("the leader's log starts at %d: not compacted past the stopped member's last entry %d", lst.FirstIndex, fst.LastIx)
	}
	t.Logf("the stopped member's log ends at %d; the leader's runs %d..%d", fst.LastIx, lst.FirstIndex, lst.LastIx)

	// Damaged streams are refused, and change nothing.
	flip := func(r io.Reader) io.Reader { return &flipAt{r: r, at: 4000} }
	leader.snaps.filter.Store(&flip)
	if err := c.Start(fid); err != nil {
		t.Fatal(err)
	}
	f := c.Member(fid)
	fdb := f.DB()
	waitFor(t, 20*time.Second, "two damaged streams refused", func() error {
		if st := f.Snapshots(); st.Refused < 2 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	st := f.Snapshots()
	if err := st.LastRefused; !errors.Is(err, ErrBadSnapshot) || !errors.Is(err, ErrSnapshotChecksum) || !strings.Contains(err.Error(), "index") {
		t.Fatalf("a damaged stream refused with %v; want an ErrBadSnapshot, ErrSnapshotChecksum naming the index", err)
	}
	var se *SnapshotError
	if !errors.As(st.LastRefused, &se) || se.Index < lst.FirstIndex-1 {
		t.Fatalf("a damaged stream: %#v, want a *SnapshotError at an index from %d", st.LastRefused, lst.FirstIndex-1)
	}
	t.Logf("refused: %v", st.LastRefused)
	if st.Received != 0 || st.Installed != 0 || f.DB() != fdb {
		t.Fatalf("after damaged streams only: %+v, engine replaced: %v", st, f.DB() != fdb)
	}
	if names := kept(t, dir, fid); len(names) != 0 {
		t.Fatalf("damaged streams kept: %v", names)
	}
	// A stream whose checksum was forged to match its damage: the engine's
	// own checksum refuses it.
	forged := forgedStream(t, leader, lid, fid)
	if err := f.receiveSnapshot(ctx, transport.NodeID(lid), bytes.NewReader(forged)); !errors.Is(err, ErrBadSnapshot) || !errors.Is(err, engine.ErrBadSnapshot) {
		t.Fatalf("a stream with a forged checksum: %v, want ErrBadSnapshot and engine.ErrBadSnapshot", err)
	}
	if err := f.receiveSnapshot(ctx, transport.NodeID(lid), bytes.NewReader(forged[:len(forged)/2])); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a stream cut short: %v, want ErrBadSnapshot", err)
	}
	if f.DB() != fdb || f.Snapshots().Installed != 0 {
		t.Fatal("a refused stream replaced the engine")
	}
	if err := sameRows(ctx, f, model); err == nil {
		t.Fatal("the member has the rows written while it was stopped, with no snapshot installed")
	}

	// Whole streams: the member installs one and has everything.
	leader.snaps.filter.Store(nil)
	waitFor(t, 30*time.Second, "the member catches up from a snapshot", func() error { return sameRows(ctx, c.Member(fid), model) })
	if st := c.Member(fid).Snapshots(); st.Installed != 1 || st.Received < 1 {
		t.Fatalf("the member caught up with %+v: want one snapshot installed", st)
	}
	if st := leader.Snapshots(); st.Built < 1 || st.Sent < 1 {
		t.Fatalf("the leader: %+v", st)
	}
	// The log after the snapshot.
	write(leader, 4, 100)
	waitFor(t, 20*time.Second, "the member applies the log after the snapshot", func() error { return sameRows(ctx, c.Member(fid), model) })

	// Restarted, it comes back from the snapshot it kept.
	if err := c.Stop(fid); err != nil {
		t.Fatal(err)
	}
	write(leader, 5, 50)
	if err := c.Start(fid); err != nil {
		t.Fatal(err)
	}
	if st := c.Member(fid).Snapshots(); st.Installed != 1 {
		t.Fatalf("restarted: %+v, want the kept snapshot installed at open", st)
	}
	waitFor(t, 20*time.Second, "the restarted member catches up", func() error { return sameRows(ctx, c.Member(fid), model) })

	// A kept snapshot damaged on disk: the member does not open.
	if err := c.Stop(fid); err != nil {
		t.Fatal(err)
	}
	keptNow := kept(t, dir, fid)
	if len(keptNow) != 1 {
		t.Fatalf("kept snapshots: %v, want one", keptNow)
	}
	good, err := os.ReadFile(keptNow[0])
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[len(bad)/3] ^= 1
	if err := os.WriteFile(keptNow[0], bad, 0o644); err != nil {
		t.Fatal(err)
	}
	err = c.Start(fid)
	if !errors.Is(err, ErrBadSnapshot) || !errors.Is(err, ErrSnapshotChecksum) || !strings.Contains(err.Error(), "expected") {
		t.Fatalf("opening on a damaged kept snapshot: %v, want ErrBadSnapshot, ErrSnapshotChecksum with what was expected", err)
	}
	t.Logf("refused at open: %v", err)
	if err := os.WriteFile(keptNow[0], good, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(fid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the member catches up again", func() error { return sameRows(ctx, c.Member(fid), model) })

	// Made leader, it has everything and takes writes.
	waitFor(t, 30*time.Second, fmt.Sprintf("member %d leads", fid), func() error {
		for _, id := range c.Peers() {
			m := c.Member(id)
			select {
			case <-m.Lost():
				// A leader that handed over its office: its owner reopens it.
				if err := c.Stop(id); err != nil {
					t.Logf("stopping %d: %v", id, err)
				}
				if err := c.Start(id); err != nil {
					return err
				}
				continue
			default:
			}
			if m.Leading() && id != fid {
				m.Runner().Do(ctx, func(n *Node) { n.TransferLeader(fid) })
			}
		}
		if !c.Member(fid).Leading() {
			return errors.New("not yet")
		}
		return nil
	})
	next := c.Member(fid)
	if err := sameRows(ctx, next, model); err != nil {
		t.Fatalf("the new leader: %v", err)
	}
	write(next, 6, 100)
	// The old leader, reopened, reloaded the checkpoints it wrote as
	// leader, and follows.
	if st := c.Member(lid).Snapshots(); st.Reinstalled != 1 {
		t.Fatalf("the old leader reopened with %+v: want its own checkpoints reloaded", st)
	}
	waitFor(t, 20*time.Second, "the old leader follows", func() error { return sameRows(ctx, c.Member(lid), model) })
}

// kept lists the streams member id keeps (not those being received).
func kept(t *testing.T, dir string, id uint64) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, fmt.Sprint(id), "snap", "recv-*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if !strings.HasSuffix(n, ".tmp") {
			out = append(out, n)
		}
	}
	return out
}

// sameRows reports how s's engine differs from want (value "" for a
// deleted key).
func sameRows(ctx context.Context, s *Silo, want map[string]string) error {
	if s == nil {
		return errors.New("stopped")
	}
	db := s.DB()
	diff := 0
	var first error
	for k, v := range want {
		row, ok, err := db.Get(ctx, &storage.Get{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)}})
		if err != nil {
			return err
		}
		got := ""
		if ok {
			got = row["v"].AsText()
		}
		if got != v {
			diff++
			if first == nil {
				first = fmt.Errorf("%s is %q, want %q", k, got, v)
			}
		}
	}
	if first != nil {
		return fmt.Errorf("%d keys differ: %w", diff, first)
	}
	return nil
}

func waitFor(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %v: %v", what, within, err)
}

// flipAt flips a bit of the byte at offset at of what it reads.
type flipAt struct {
	r     io.Reader
	at, n int64
}

func (f *flipAt) Read(p []byte) (int, error) {
	k, err := f.r.Read(p)
	if f.at >= f.n && f.at < f.n+int64(k) {
		p[f.at-f.n] ^= 0x40
	}
	f.n += int64(k)
	return k, err
}

// forgedStream is the leader's last stream with a byte of the engine's
// snapshot flipped and the descriptor's checksum made to match.
func forgedStream(t *testing.T, leader *Silo, from, to uint64) []byte {
	t.Helper()
	leader.snaps.buildMu.Lock()
	sp := leader.snaps.spool
	leader.snaps.buildMu.Unlock()
	if sp == nil {
		t.Fatal("the leader has no stream")
	}
	body, err := os.ReadFile(sp.path)
	if err != nil {
		t.Fatal(err)
	}
	body[len(body)/2] ^= 0x40
	d := sp.desc
	d.sum = sha256.Sum256(body)
	hdr, err := streamHeader(pb.Message{Type: pb.MsgSnap, From: from, To: to, Term: 1,
		Snapshot: &pb.Snapshot{Metadata: sp.meta, Data: d.encode()}})
	if err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}
