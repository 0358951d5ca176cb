package postgres_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/postgres"
)

// proxy forwards TCP connections to PostgreSQL until cut, when it closes
// every connection and stops listening: the network failing under a client.
type proxy struct {
	ln     net.Listener
	target string
	// dropReplies, once set, makes the proxy cut a connection at the first
	// bytes the server sends on it, instead of forwarding them: a request
	// reaches the server, its answer never reaches the client.
	dropReplies atomic.Bool
	// delay holds back every reply from the server by this long.
	delay atomic.Int64 // time.Duration
	// replies counts the reads that brought the proxy bytes from the
	// server: on an idle connection, one per round trip.
	replies atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				defer c.Close()
				defer s.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && p.dropReplies.Load() {
						return
					}
					if n > 0 {
						p.replies.Add(1)
					}
					time.Sleep(time.Duration(p.delay.Load()))
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// withHost returns dsn (a URL) pointing at addr.
func withHost(t *testing.T, dsn, addr string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("this test needs a URL DSN, got %q", dsn)
	}
	u.Host = addr
	return u.String()
}

// viaProxy creates namespace ns with a table t (k BIGINT, v BIGINT) and
// returns a backend connected directly, one connected through a proxy that
// the test can cut, and the proxy.
func viaProxy(t *testing.T, ns string, maxConns int32) (direct, proxied storage.Backend, p *proxy) {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	ctx := context.Background()
	direct = open(t)
	t.Cleanup(func() {
		// A fresh backend: the test may have closed the direct one.
		clean := open(t)
		defer clean.Close()
		_ = clean.DropTable(context.Background(), ns, "t")
		_ = clean.DropNamespace(context.Background(), ns)
		direct.Close()
	})
	_ = direct.DropTable(ctx, ns, "t")
	_ = direct.DropNamespace(ctx, ns)
	if err := direct.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	tb := &storage.Table{Namespace: ns, Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}
	if err := direct.CreateTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(dsn)
	p = newProxy(t, u.Host)
	b, err := postgres.Open(ctx, postgres.Config{DSN: withHost(t, dsn, p.ln.Addr().String()), MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return direct, b, p
}

func TestConnectionErrorsAreTyped(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx := context.Background()

	// Nothing listening: Open fails with a retryable ErrUnavailable.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	_, err := postgres.Open(ctx, postgres.Config{DSN: withHost(t, dsn, dead)})
	if !errors.Is(err, storage.ErrUnavailable) || !storage.IsRetryable(err) {
		t.Fatalf("Open of a dead address: %v, want retryable ErrUnavailable", err)
	}

	const ns = "conntest"
	direct, b, p := viaProxy(t, ns, 0)
	put := func(k, v int64) *storage.Put {
		return &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(k)}, Values: storage.Values{"v": storage.BigInt(v)}}
	}
	get := &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(1)}}
	if err := b.Put(ctx, put(1, 1)); err != nil {
		t.Fatal(err)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put(ctx, put(2, 2)); err != nil {
		t.Fatal(err)
	}

	p.cut()

	// A transaction cut before its commit: the commit fails with a typed
	// error, and (checked below) nothing of it is visible.
	err = tx.Commit(ctx)
	t.Logf("commit over a cut connection: %v", err)
	if !errors.Is(err, storage.ErrUnavailable) && !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("Commit over a cut connection: %v, want ErrUnavailable or ErrCommitUnknown", err)
	}
	_, _, err = b.Get(ctx, get)
	t.Logf("get over a cut connection: %v", err)
	if !errors.Is(err, storage.ErrUnavailable) || !storage.IsRetryable(err) {
		t.Fatalf("Get over a cut connection: %v, want retryable ErrUnavailable", err)
	}
	if _, err := b.Begin(ctx); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("Begin over a cut connection: %v, want ErrUnavailable", err)
	}
	if err := b.Put(ctx, put(3, 3)); !errors.Is(err, storage.ErrUnavailable) && !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("Put over a cut connection: %v, want ErrUnavailable or ErrCommitUnknown", err)
	}
	if _, err := b.Scan(ctx, &storage.Scan{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(1)}}); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("Scan over a cut connection: %v, want ErrUnavailable", err)
	}
	if _, ok, err := direct.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(2)}}); err != nil || ok {
		t.Fatalf("the cut transaction's write is visible (ok=%v, err=%v)", ok, err)
	}
	if err := direct.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := direct.Get(ctx, get); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
}

// TestCommitOutcomeUnknown loses the server's answer to COMMIT: the commit
// happened, but the client cannot know, so it must get ErrCommitUnknown —
// which Update does not retry — and never ErrConflict or ErrUnavailable,
// which would invite a retry that applies the work twice.
func TestCommitOutcomeUnknown(t *testing.T) {
	ctx := context.Background()
	const ns = "commitunknown"
	direct, b, p := viaProxy(t, ns, 1)
	// The transaction's statements travel with its COMMIT in one round
	// trip once the connection has them prepared: a transaction of the
	// same shape prepares them, so the lost reply is the COMMIT's.
	preparedTxn(t, b, ns, 4)
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put(ctx, &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(5)}, Values: storage.Values{"v": storage.BigInt(5)}}); err != nil {
		t.Fatal(err)
	}
	p.dropReplies.Store(true)
	err = tx.Commit(ctx)
	t.Logf("commit whose reply was lost: %v", err)
	if !errors.Is(err, storage.ErrCommitUnknown) || storage.IsRetryable(err) {
		t.Fatalf("Commit whose reply was lost: %v, want ErrCommitUnknown (not retryable)", err)
	}
	if _, ok, err := direct.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(5)}}); err != nil || !ok {
		t.Fatalf("the commit did happen, yet the row is not there (ok=%v, err=%v)", ok, err)
	}
}

// TestTxnRoundTrips: a transaction sends BEGIN with its first statement
// and its unconditional writes with the next statement that needs an
// answer, or with COMMIT. Put, Get, Put, Commit is then two round trips,
// not five, and the Get still reads the transaction's own Put.
func TestTxnRoundTrips(t *testing.T) {
	ctx := context.Background()
	const ns = "roundtrips"
	direct, b, p := viaProxy(t, ns, 1)
	put := func(k int64) *storage.Put {
		return &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(k)}, Values: storage.Values{"v": storage.BigInt(k)}}
	}
	// begin starts a transaction and returns it with the replies counted
	// so far. Its caller defers Abort: a failure must give the backend's
	// one connection back, as closing the backend waits for it; after
	// Commit, Abort does nothing.
	begin := func() (storage.Txn, int64) {
		before := p.replies.Load()
		tx, err := b.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx, before
	}
	run := func() (trips int64) {
		tx, before := begin()
		defer tx.Abort(ctx) // see begin
		if err := tx.Put(ctx, put(7)); err != nil {
			t.Fatal(err)
		}
		row, ok, err := tx.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(7)}})
		if err != nil || !ok || row["v"].AsBigInt() != 7 {
			t.Fatalf("the transaction does not read its own queued put: %v, %v, %v", row, ok, err)
		}
		if err := tx.Put(ctx, put(8)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return p.replies.Load() - before
	}
	run() // prepares the statements on the one connection
	if n := run(); n > 2 {
		t.Errorf("put, get, put, commit took %d round trips, want 2", n)
	}
	if _, ok, err := direct.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(8)}}); err != nil || !ok {
		t.Fatalf("the put sent with COMMIT is not there: %v, %v", ok, err)
	}
	// A Deferred IfNotExists put goes with COMMIT too: one round trip for
	// the transaction. (When the row exists the failed transaction is
	// rolled back besides.)
	deferred := func(k int64) (trips int64, err error) {
		tx, before := begin()
		defer tx.Abort(ctx) // see begin
		d := put(k)
		d.Condition, d.Deferred = storage.IfNotExists(), true
		if err := tx.Put(ctx, d); err != nil {
			t.Fatal(err)
		}
		err = tx.Commit(ctx)
		return p.replies.Load() - before, err
	}
	if _, err := deferred(20); err != nil { // prepares the INSERT
		t.Fatal(err)
	}
	if n, err := deferred(21); err != nil || n > 1 {
		t.Errorf("a deferred put of a missing row and commit: %d round trips, %v; want 1, nil", n, err)
	}
	if _, err := deferred(21); !errors.Is(err, storage.ErrConditionNotMet) {
		t.Errorf("a deferred put of an existing row and commit: %v; want ErrConditionNotMet", err)
	}
	// A Skippable If put goes with COMMIT as well, whether its condition
	// holds or not, and the transaction commits either way.
	skippable := func(k, v int64) int64 {
		tx, before := begin()
		defer tx.Abort(ctx) // see begin
		s := put(k)
		s.Values["v"] = storage.BigInt(v)
		s.Condition, s.Skippable = storage.If(storage.Lt("v", storage.BigInt(v))), true
		if err := tx.Put(ctx, s); err != nil {
			t.Fatalf("a skippable put: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("a skippable put: %v", err)
		}
		return p.replies.Load() - before
	}
	skippable(21, 30) // prepares the UPDATE
	for _, c := range []struct{ v, want int64 }{{40, 40}, {35, 40}} {
		if n := skippable(21, c.v); n > 1 {
			t.Errorf("a skippable put of %d and commit: %d round trips, want 1", c.v, n)
		}
		row, _, err := direct.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(21)}})
		if err != nil || row["v"].AsBigInt() != c.want {
			t.Errorf("after a skippable put of %d: %v, %v; want v = %d", c.v, row, err, c.want)
		}
	}
}

// preparedTxn commits a transaction that puts key k in ns.t on b, so that
// b's connection has the statements of such a transaction prepared: the
// next one sends BEGIN, its write and COMMIT in a single round trip.
func preparedTxn(t *testing.T, b storage.Backend, ns string, k int64) {
	t.Helper()
	ctx := context.Background()
	err := storage.Update(ctx, b, func(tx storage.Txn) error {
		return tx.Put(ctx, &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(k)}, Values: storage.Values{"v": storage.BigInt(k)}})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCommitDeadline: the caller's deadline expires while the server is
// still answering COMMIT (or an autocommitted write). The write happens; the
// caller must be told the outcome is unknown, not merely that its context
// ended. The proxied backend has one connection, on which the write's
// statement is already prepared, so the delayed reply is the execution's.
func TestCommitDeadline(t *testing.T) {
	const ns = "commitdeadline"
	direct, b, p := viaProxy(t, ns, 1)
	ctx := context.Background()
	key := func(k int64) storage.Values { return storage.Values{"k": storage.BigInt(k)} }
	put := func(k, v int64) *storage.Put {
		return &storage.Put{Namespace: ns, Table: "t", Partition: key(k), Values: storage.Values{"v": storage.BigInt(v)}}
	}
	value := func(k int64) (int64, bool) {
		t.Helper()
		row, ok, err := direct.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: key(k)})
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return 0, false
		}
		return row["v"].AsBigInt(), true
	}
	slow := func(f func(context.Context) error) error {
		p.delay.Store(int64(300 * time.Millisecond))
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		err := f(short)
		p.delay.Store(0)
		time.Sleep(400 * time.Millisecond) // let the delayed reply drain
		return err
	}

	preparedTxn(t, b, ns, 100)
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put(ctx, put(0, 1)); err != nil {
		t.Fatal(err)
	}
	err = slow(tx.Commit)
	if !errors.Is(err, storage.ErrCommitUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("commit: %v, want ErrCommitUnknown wrapping the deadline", err)
	}
	if v, ok := value(0); !ok || v != 1 {
		t.Fatalf("the commit did happen, yet the row is %v, %v", v, ok)
	}

	if err := b.Put(ctx, put(1, 1)); err != nil { // prepares the statement
		t.Fatal(err)
	}
	err = slow(func(c context.Context) error { return b.Put(c, put(1, 2)) })
	if !errors.Is(err, storage.ErrCommitUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("autocommitted put: %v, want ErrCommitUnknown wrapping the deadline", err)
	}
	if v, _ := value(1); v != 2 {
		t.Fatalf("the put did happen, yet the value is %d", v)
	}

	// A context that ended before Commit sends nothing: a plain context error.
	tx, err = b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put(ctx, put(9, 9)); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := tx.Commit(done); errors.Is(err, storage.ErrCommitUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("commit with a dead context: %v, want context.Canceled and not ErrCommitUnknown", err)
	}
	if _, ok := value(9); ok {
		t.Fatal("a commit that was never sent took effect")
	}
}
