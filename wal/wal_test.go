package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestAppendReadReopen(t *testing.T) {
	fs := vfs.NewCrashableMem()
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	ctx := context.Background()
	const n = 500 // about 11 segments of 8 KiB
	for i := 1; i <= n; i++ {
		idx, err := l.Append(ctx, payload(0, i))
		if err != nil || idx != uint64(i) {
			t.Fatalf("append %d: index %d, %v", i, idx, err)
		}
	}
	idx, err := l.AppendBatch(ctx, [][]byte{payload(1, 1), payload(1, 2), {}})
	if err != nil || idx != n+1 {
		t.Fatalf("batch: %d, %v", idx, err)
	}
	check := func(l *Log) {
		t.Helper()
		all := readAll(t, l)
		if len(all) != n+3 || l.LastIndex() != n+3 || l.FirstIndex() != 1 {
			t.Fatalf("%d records, first %d, last %d", len(all), l.FirstIndex(), l.LastIndex())
		}
		for i := 1; i <= n; i++ {
			if !bytes.Equal(all[uint64(i)], payload(0, i)) {
				t.Fatalf("record %d differs", i)
			}
		}
		if got, _ := l.Read(n + 2); !bytes.Equal(got, payload(1, 2)) {
			t.Fatalf("Read(%d) = %q", n+2, got)
		}
		if got, err := l.Read(n + 3); err != nil || len(got) != 0 {
			t.Fatalf("empty record: %q, %v", got, err)
		}
		if _, err := l.Read(n + 4); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("Read past the end: %v", err)
		}
	}
	check(l)
	if segs := l.Recovery().Segments; segs != 1 {
		t.Fatalf("fresh log reports %d segments", segs)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	l = mustOpen(t, testConfig(fs, GroupPolicy(time.Millisecond)))
	defer l.Close()
	rec := l.Recovery()
	if rec.Segments < 5 || rec.LastIndex != n+3 || rec.TornTail != nil {
		t.Fatalf("recovery: %+v", rec)
	}
	check(l)
	if idx, err := l.Append(ctx, []byte("after")); err != nil || idx != n+4 {
		t.Fatalf("append after reopen: %d, %v", idx, err)
	}
	if _, err := l.Append(ctx, make([]byte, 2<<10+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized record: %v", err)
	}
}

func TestPoliciesConcurrent(t *testing.T) {
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			l := mustOpen(t, testConfig(fs, p))
			const writers, each = 8, 60
			var wg sync.WaitGroup
			seen := make([]map[uint64]int, writers)
			for w := range writers {
				wg.Add(1)
				seen[w] = map[uint64]int{}
				go func() {
					defer wg.Done()
					for s := range each {
						idx, err := l.Append(context.Background(), payload(w, s))
						if err != nil {
							t.Error(err)
							return
						}
						seen[w][idx] = s
					}
				}()
			}
			wg.Wait()
			st := l.Stats()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = mustOpen(t, testConfig(fs, p))
			defer l.Close()
			all := readAll(t, l)
			if len(all) != writers*each {
				t.Fatalf("%d records, want %d", len(all), writers*each)
			}
			for w := range writers {
				bySeq := make([]uint64, each)
				for idx, s := range seen[w] {
					if !bytes.Equal(all[idx], payload(w, s)) {
						t.Fatalf("index %d holds %q, want writer %d seq %d", idx, all[idx], w, s)
					}
					bySeq[s] = idx
				}
				for s := 1; s < each; s++ {
					if bySeq[s] <= bySeq[s-1] {
						t.Fatalf("writer %d: seq %d got index %d, not after seq %d's %d", w, s, bySeq[s], s-1, bySeq[s-1])
					}
				}
			}
			if p.Kind != Periodic && st.Syncs == 0 {
				t.Fatalf("no fsync under %v", p)
			}
			t.Logf("%v: %d appends, %d writes, %d fsyncs", p, st.Appends, st.Writes, st.Syncs)
		})
	}
}

// TestAckAfterSync holds the disk's fsync and checks, for every policy
// but Periodic, that no append returns before an fsync that started after
// its record was written has returned, and that a record appended while an
// fsync is in flight waits for the next one.
func TestAckAfterSync(t *testing.T) {
	for _, p := range []Policy{BatchPolicy(), GroupPolicy(time.Millisecond), CountPolicy(1, time.Millisecond)} {
		t.Run(p.String(), func(t *testing.T) {
			g := newGateFS(vfs.NewCrashableMem())
			l := mustOpen(t, testConfig(g, p))
			defer l.Close()
			g.hold.Store(true)
			a := appendAsync(l, []byte("a"))
			release1 := <-g.waiting // the fsync covering a has started, and is held
			b := appendAsync(l, []byte("b"))
			time.Sleep(20 * time.Millisecond)
			select {
			case err := <-a:
				t.Fatalf("a acknowledged while its fsync is held (err %v)", err)
			case err := <-b:
				t.Fatalf("b acknowledged while no fsync covering it ran (err %v)", err)
			default:
			}
			close(release1)
			if err := <-a; err != nil {
				t.Fatal(err)
			}
			release2 := <-g.waiting // b needs an fsync of its own
			select {
			case err := <-b:
				t.Fatalf("b acknowledged by the fsync that started before it was written (err %v)", err)
			case <-time.After(20 * time.Millisecond):
			}
			close(release2)
			if err := <-b; err != nil {
				t.Fatal(err)
			}
			if d := l.DurableIndex(); d != 2 {
				t.Fatalf("durable index %d, want 2", d)
			}
			g.hold.Store(false)
		})
	}
}

func TestPeriodicAcksBeforeSync(t *testing.T) {
	g := newGateFS(vfs.NewCrashableMem())
	l := mustOpen(t, testConfig(g, PeriodicPolicy(time.Hour)))
	g.started.Store(0) // count from here: Open fsyncs the recovered tail
	g.hold.Store(true)
	for i := range 10 {
		if _, err := l.Append(context.Background(), payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	if g.started.Load() != 0 || l.DurableIndex() != 0 {
		t.Fatalf("periodic synced early: %d fsyncs, durable %d", g.started.Load(), l.DurableIndex())
	}
	done := make(chan error, 1)
	go func() { done <- l.Close() }()
	close(<-g.waiting) // Close fsyncs what is left
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCountPolicy(t *testing.T) {
	g := newGateFS(vfs.NewCrashableMem())
	l := mustOpen(t, testConfig(g, CountPolicy(4, time.Hour)))
	g.started.Store(0) // count from here: Open fsyncs the recovered tail
	defer l.Close()
	var acks []chan error
	for i := range 3 {
		acks = append(acks, appendAsync(l, payload(0, i)))
	}
	time.Sleep(30 * time.Millisecond)
	if n := g.started.Load(); n != 0 {
		t.Fatalf("fsync with 3 of 4 records pending (%d)", n)
	}
	acks = append(acks, appendAsync(l, payload(0, 3)))
	for _, a := range acks {
		if err := <-a; err != nil {
			t.Fatal(err)
		}
	}
	if n := g.started.Load(); n != 1 {
		t.Fatalf("%d fsyncs for one batch of 4", n)
	}
	// MaxWait bounds the wait of a lone record.
	l2 := mustOpen(t, func() Config { c := testConfig(vfs.NewCrashableMem(), CountPolicy(1000, 5*time.Millisecond)); return c }())
	defer l2.Close()
	start := time.Now()
	if _, err := l2.Append(context.Background(), []byte("lone")); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 5*time.Millisecond {
		t.Fatal("lone record acknowledged before max wait with the count unmet")
	}
}

func TestBackpressure(t *testing.T) {
	g := newGateFS(vfs.NewCrashableMem())
	cfg := testConfig(g, BatchPolicy())
	cfg.MaxPending = 4 << 10
	l := mustOpen(t, cfg)
	defer l.Close()
	g.hold.Store(true)
	first := appendAsync(l, make([]byte, 100))
	release := <-g.waiting // a round is in flight; the queue fills behind it
	var queued []chan error
	for range 3 {
		queued = append(queued, appendAsync(l, make([]byte, 1000)))
	}
	time.Sleep(10 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := l.Append(ctx, make([]byte, 2000)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append over the pending bound: %v, want it to block until the deadline", err)
	}
	last := l.LastIndex()
	g.hold.Store(false)
	close(release)
	for _, c := range append(queued, first) {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if got := len(readAll(t, l)); uint64(got) != last || last != 4 {
		t.Fatalf("%d records, last index %d: the refused append must not be in the log", got, last)
	}
}

func TestTruncateFront(t *testing.T) {
	fs := vfs.NewCrashableMem()
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	ctx := context.Background()
	for i := 1; i <= 300; i++ {
		if _, err := l.Append(ctx, payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.TruncateFront(150); err != nil {
		t.Fatal(err)
	}
	first := l.FirstIndex()
	if first > 150 || first < 100 {
		t.Fatalf("first index %d after TruncateFront(150)", first)
	}
	if _, err := l.Read(first - 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read below the first index: %v", err)
	}
	l.Close()
	l = mustOpen(t, testConfig(fs, BatchPolicy()))
	defer l.Close()
	if l.FirstIndex() != first || l.LastIndex() != 300 {
		t.Fatalf("after reopen: %d..%d, want %d..300", l.FirstIndex(), l.LastIndex(), first)
	}
	all := readAll(t, l)
	for i := first; i <= 300; i++ {
		if !bytes.Equal(all[i], payload(0, int(i))) {
			t.Fatalf("record %d lost", i)
		}
	}
}

// TestTruncateFrontRecycles: with RecycleSegments, truncated segments are
// kept under temporary names, at most that many, and become the next
// segments, overwritten with zeros (a kept file reused as it was would
// leave old records past the new ones, which a reopen takes for
// corruption). A file of another segment size is removed, not kept, and
// an Open removes the kept files.
func TestTruncateFrontRecycles(t *testing.T) {
	fs := vfs.NewCrashableMem()
	cfg := testConfig(fs, BatchPolicy())
	cfg.RecycleSegments = 2
	l := mustOpen(t, cfg)
	ctx := context.Background()
	appendRange := func(l *Log, from, to int) {
		t.Helper()
		for i := from; i <= to; i++ {
			if _, err := l.Append(ctx, payload(0, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	kept := func() (n int) {
		names, err := fs.List("/wal")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if strings.HasPrefix(name, "recycled-") {
				n++
			}
		}
		return n
	}
	check := func(l *Log, last int) {
		t.Helper()
		all := readAll(t, l)
		if l.LastIndex() != uint64(last) || uint64(len(all)) != uint64(last)+1-l.FirstIndex() {
			t.Fatalf("log %d..%d holds %d records, want up to %d", l.FirstIndex(), l.LastIndex(), len(all), last)
		}
		for i := l.FirstIndex(); i <= uint64(last); i++ {
			if !bytes.Equal(all[i], payload(0, int(i))) {
				t.Fatalf("record %d lost or changed", i)
			}
		}
	}
	appendRange(l, 1, 300)
	if err := l.TruncateFront(250); err != nil {
		t.Fatal(err)
	}
	if n := kept(); n != 2 {
		t.Fatalf("%d segment files kept after truncating several, want 2", n)
	}
	appendRange(l, 301, 600)
	if st := l.Stats(); st.Recycled != 2 {
		t.Fatalf("%d segments reused, want 2", st.Recycled)
	}
	if n := kept(); n != 0 {
		t.Fatalf("%d kept files left after they were reused", n)
	}
	check(l, 600)
	l.Close()
	l = mustOpen(t, cfg) // reads the reused segments back
	check(l, 600)
	if err := l.TruncateFront(550); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if n := kept(); n != 2 {
		t.Fatalf("%d kept files at close, want 2", n)
	}
	l = mustOpen(t, cfg)
	if n := kept(); n != 0 {
		t.Fatalf("%d kept files after Open, want none", n)
	}
	check(l, 600)
	l.Close()

	// Reopened with another segment size, the old segments are removed.
	cfg.SegmentSize *= 2
	l = mustOpen(t, cfg)
	defer l.Close()
	appendRange(l, 601, 700)
	if err := l.TruncateFront(690); err != nil {
		t.Fatal(err)
	}
	// The segment that was last at the reopen took records up to the new
	// size, and its padded last write may have made it that size: that
	// one may be kept. No file of the old size may.
	names, err := fs.List("/wal")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "recycled-") {
			continue
		}
		if st, err := fs.Stat("/wal/" + name); err != nil || st.Size() != cfg.SegmentSize {
			t.Fatalf("kept %s of another segment size (%v)", name, err)
		}
	}
	check(l, 700)
}

// TestScanDuringRecycling: scans run while the log's prefix is truncated
// and its segments reused. A scan may find its start truncated, or a file
// gone, but it never reads a file the preparer is overwriting: every record
// it returns is the one appended at that index, and it never reports
// corruption.
func TestScanDuringRecycling(t *testing.T) {
	cfg := testConfig(vfs.NewMem(), BatchPolicy())
	cfg.RecycleSegments = 2
	l := mustOpen(t, cfg)
	defer l.Close()
	ctx := context.Background()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // appends and truncates
		defer wg.Done()
		for i := 1; !stop.Load(); i++ {
			if _, err := l.Append(ctx, payload(0, i)); err != nil {
				t.Error(err)
				return
			}
			if i%10 == 0 && i > 60 {
				if err := l.TruncateFront(uint64(i - 60)); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	scans := 0
	go func() {
		defer wg.Done()
		for !stop.Load() {
			err := l.Scan(l.FirstIndex(), func(i uint64, p []byte) error {
				if !bytes.Equal(p, payload(0, int(i))) {
					return fmt.Errorf("record %d is not the one appended", i)
				}
				return nil
			})
			if err != nil && !errors.Is(err, ErrOutOfRange) && !oserror.IsNotExist(err) {
				t.Errorf("scan during recycling: %v", err)
				return
			}
			scans++
		}
	}()
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if st := l.Stats(); st.Recycled == 0 || scans == 0 {
		t.Fatalf("%d segments reused, %d scans: the test did not race them", st.Recycled, scans)
	}
}

// TestTruncateFrontKeepsUninstalledSegment: an append that opens a new
// segment adds it to the log at once, but its file exists only once the
// syncer installs it. TruncateFront up to that segment's first index must
// not remove the last segment on disk meanwhile.
func TestTruncateFrontKeepsUninstalledSegment(t *testing.T) {
	mem := vfs.NewCrashableMem()
	cfg := Config{Dir: "/wal", FS: DelaySyncFS(mem, 300*time.Millisecond), Policy: BatchPolicy(), SegmentSize: 4 << 10,
		MaxRecordSize: 4 << 10, Logf: func(string, ...any) {}}
	l := mustOpen(t, cfg)
	ctx := context.Background()
	first := bytes.Repeat([]byte{1}, 1000)
	if _, err := l.Append(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := appendAsync(l, bytes.Repeat([]byte{2}, 3500)) // opens segment 2
	for l.LastIndex() < 2 {
		time.Sleep(time.Millisecond)
	}
	if err := l.TruncateFront(2); err != nil {
		t.Fatal(err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	<-second
	l.Close()
	cfg.FS = crashed
	l = mustOpen(t, cfg)
	defer l.Close()
	if got, err := l.Read(1); err != nil || !bytes.Equal(got, first) {
		t.Fatalf("acknowledged record 1 after TruncateFront(2) and a crash: %v (log %d..%d)", err, l.FirstIndex(), l.LastIndex())
	}
}

// TestLowerRecordLimitKeepsOldRecords: reopening with a smaller
// MaxRecordSize bounds new appends only; a record written under the old
// limit is still read back, not taken for a torn tail.
func TestLowerRecordLimitKeepsOldRecords(t *testing.T) {
	mem := vfs.NewCrashableMem()
	cfg := testConfig(mem, BatchPolicy())
	cfg.MaxRecordSize = 4 << 10
	l := mustOpen(t, cfg)
	ctx := context.Background()
	big := bytes.Repeat([]byte{7}, 3000)
	for _, p := range [][]byte{big, []byte("after")} {
		if _, err := l.Append(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	cfg.MaxRecordSize = 1 << 10
	l = mustOpen(t, cfg)
	defer l.Close()
	all := readAll(t, l)
	if !bytes.Equal(all[1], big) || string(all[2]) != "after" || l.LastIndex() != 2 {
		t.Fatalf("after reopening with a lower limit: %d records, last %d", len(all), l.LastIndex())
	}
	if _, err := l.Append(ctx, big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("append over the new limit: %v", err)
	}
}

func TestTruncateAfter(t *testing.T) {
	ctx := context.Background()
	for _, cut := range []uint64{0, 1, 37, 120, 199, 200} {
		fs := vfs.NewCrashableMem()
		l := mustOpen(t, testConfig(fs, GroupPolicy(time.Millisecond)))
		for i := 1; i <= 200; i++ {
			if _, err := l.Append(ctx, payload(0, i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.TruncateAfter(ctx, cut); err != nil {
			t.Fatalf("TruncateAfter(%d): %v", cut, err)
		}
		if l.LastIndex() != cut {
			t.Fatalf("TruncateAfter(%d): last index %d", cut, l.LastIndex())
		}
		for i := 1; i <= 20; i++ {
			if idx, err := l.Append(ctx, payload(1, i)); err != nil || idx != cut+uint64(i) {
				t.Fatalf("append after truncation: %d, %v", idx, err)
			}
		}
		l.Close()
		l = mustOpen(t, testConfig(fs, BatchPolicy()))
		all := readAll(t, l)
		if uint64(len(all)) != cut+20 || l.Recovery().TornTail != nil {
			t.Fatalf("cut %d: %d records after reopen, recovery %+v", cut, len(all), l.Recovery())
		}
		for i := uint64(1); i <= cut+20; i++ {
			want := payload(0, int(i))
			if i > cut {
				want = payload(1, int(i-cut))
			}
			if !bytes.Equal(all[i], want) {
				t.Fatalf("cut %d: record %d = %q", cut, i, all[i])
			}
		}
		if err := l.TruncateAfter(ctx, cut+21); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("truncate past the end: %v", err)
		}
		l.Close()
	}
}

func TestOpenLocks(t *testing.T) {
	fs := vfs.NewCrashableMem()
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	defer l.Close()
	if _, err := Open(testConfig(fs, BatchPolicy())); err == nil {
		t.Fatal("a second Open of the same directory succeeded")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{FS: vfs.NewMem(), Policy: BatchPolicy()},
		{Dir: "/w", FS: vfs.NewMem()},
		{Dir: "/w", FS: vfs.NewMem(), Policy: GroupPolicy(0)},
		{Dir: "/w", FS: vfs.NewMem(), Policy: CountPolicy(0, time.Second)},
		{Dir: "/w", FS: vfs.NewMem(), Policy: PeriodicPolicy(-1)},
		{Dir: "/w", FS: vfs.NewMem(), Policy: BatchPolicy(), SegmentSize: 100},
		{Dir: "/w", FS: vfs.NewMem(), Policy: BatchPolicy(), MaxPending: -1},
	} {
		if _, err := Open(c); err == nil {
			t.Errorf("Open(%+v) accepted a bad config", c)
		}
	}
}

// TestPeriodicSyncIsDurable: under Periodic, Sync must not return before an
// fsync covers every record appended before it was called, even while
// appends keep the syncer busy with write-only rounds.
func TestPeriodicSyncIsDurable(t *testing.T) {
	l := mustOpen(t, testConfig(vfs.NewCrashableMem(), PeriodicPolicy(time.Hour)))
	defer l.Close()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 0; ctx.Err() == nil; s++ {
				if _, err := l.Append(ctx, payload(w, s)); err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for l.LastIndex() < 100 {
		time.Sleep(time.Millisecond) // appends are flowing
	}
	syncs := 0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); syncs++ {
		want := l.LastIndex()
		if err := l.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := l.DurableIndex(); got < want {
			stop()
			wg.Wait()
			t.Fatalf("Sync returned with durable index %d; %d had been appended before it", got, want)
		}
	}
	stop()
	wg.Wait()
	t.Logf("%d Sync calls among %d appends", syncs, l.LastIndex())
}

// TestTruncationsAndClose: TruncateFront and TruncateAfter may run at the
// same time and with appends; truncation after Close is refused; every
// Close returns the same answer once the log is really closed.
func TestTruncationsAndClose(t *testing.T) {
	fs := vfs.NewCrashableMem()
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	ctx := context.Background()
	for i := 1; i <= 400; i++ {
		if _, err := l.Append(ctx, payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs <- l.TruncateFront(200) }()
	go func() { defer wg.Done(); errs <- l.TruncateAfter(ctx, 300) }()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	first, last := l.FirstIndex(), l.LastIndex()
	if last != 300 || first > 200 || first < 100 {
		t.Fatalf("after both truncations: %d..%d", first, last)
	}
	all := readAll(t, l)
	if uint64(len(all)) != last-first+1 {
		t.Fatalf("%d records readable in %d..%d", len(all), first, last)
	}
	results := make(chan error, 2)
	go func() { results <- l.Close() }()
	go func() { results <- l.Close() }()
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if err := l.TruncateFront(250); !errors.Is(err, ErrClosed) {
		t.Fatalf("TruncateFront after Close: %v", err)
	}
	if err := l.TruncateAfter(ctx, 250); !errors.Is(err, ErrClosed) {
		t.Fatalf("TruncateAfter after Close: %v", err)
	}
	l = mustOpen(t, testConfig(fs, BatchPolicy()))
	defer l.Close()
	if l.FirstIndex() != first || l.LastIndex() != 300 || len(readAll(t, l)) != len(all) {
		t.Fatalf("after reopen: %d..%d", l.FirstIndex(), l.LastIndex())
	}
}
