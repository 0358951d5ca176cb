package cassandra_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/storage/coordinator"
)

// fault is what a proxy does to the requests it meets while armed.
type fault int32

const (
	passThrough fault = iota
	// loseReply forwards the request, waits for the node's reply, drops
	// it and closes the client's connection: the request took effect and
	// the client cannot know.
	loseReply
	// loseRequest drops the request and closes the client's connection:
	// the request never reached the node.
	loseRequest
)

// proxy is a TCP proxy in front of one Cassandra node that loses the
// replies (or the requests) sent while it is armed, the connection
// closing with them, as a network failure after (or before) the request
// was sent would.
type proxy struct {
	ln     net.Listener
	target string
	fault  atomic.Int32
	reset  atomic.Bool  // close the client's side with a reset rather than a FIN
	cut    atomic.Int64 // connections the armed fault closed

	mu struct {
		sync.Mutex
		conns  map[net.Conn]struct{}
		closed bool
	}
	wg sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.mu.conns = map[net.Conn]struct{}{}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// arm makes the proxy apply f to every connection that sends while it is
// armed; arm(passThrough) disarms it.
func (p *proxy) arm(f fault) { p.fault.Store(int32(f)) }

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.mu.closed = true
	for c := range p.mu.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c, or closes it if the proxy is closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		c.Close()
		return false
	}
	p.mu.conns[c] = struct{}{}
	return true
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve relays one connection. Under loseReply, a connection that sends
// while armed is doomed: the first bytes the node sends back on it after
// that are dropped and both sides closed.
func (p *proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(server) {
		client.Close()
		return
	}
	var once sync.Once
	closeBoth := func(faulty bool) {
		once.Do(func() {
			if faulty {
				if tc, ok := client.(*net.TCPConn); ok && p.reset.Load() {
					_ = tc.SetLinger(0)
				}
				p.cut.Add(1)
			}
			client.Close()
			server.Close()
		})
	}
	var doomed atomic.Bool
	p.wg.Add(1)
	go func() { // client → node
		defer p.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				switch fault(p.fault.Load()) {
				case loseRequest:
					closeBoth(true)
					return
				case loseReply:
					doomed.Store(true)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					closeBoth(false)
					return
				}
			}
			if err != nil {
				closeBoth(false)
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for { // node → client
		n, err := server.Read(buf)
		if n > 0 {
			if doomed.Load() {
				closeBoth(true)
				return
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				closeBoth(false)
				return
			}
		}
		if err != nil {
			closeBoth(false)
			return
		}
	}
}

// proxied opens a DB on the test Cassandra through a new proxy. The
// driver dials the nodes it discovers on Config.Port, the proxy's, at the
// address the node gives: for the single node of the test cluster, the
// proxy. Every test checks that its faults were met, so a driver that
// went around the proxy fails it.
func proxied(t *testing.T) (*cassandra.DB, *proxy) {
	t.Helper()
	cfg := testConfig(t)
	if len(cfg.Contacts) != 1 || !strings.HasPrefix(cfg.Contacts[0], "127.0.0.1:") {
		t.Skipf("the proxy tests need a one-node Cassandra on 127.0.0.1, not %v", cfg.Contacts)
	}
	p := startProxy(t, cfg.Contacts[0])
	cfg.Contacts = []string{p.addr()}
	cfg.Port = 0
	db, err := cassandra.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, p
}

// settle waits until read, through a DB that a fault left without
// connections, succeeds: the driver reconnects in the background.
func settle(t *testing.T, read func() error) {
	t.Helper()
	start := time.Now()
	for {
		err := read()
		if err == nil {
			return
		}
		if !errors.Is(err, storage.ErrUnavailable) || time.Since(start) > time.Minute {
			t.Fatalf("reading after a fault: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// withFault runs op with the proxy armed with f, and checks that the
// fault cut a connection.
func withFault(t *testing.T, p *proxy, f fault, op func() error) error {
	t.Helper()
	before := p.cut.Load()
	p.arm(f)
	err := op()
	p.arm(passThrough)
	if p.cut.Load() == before {
		t.Fatalf("the armed proxy cut no connection (the driver went around it?); the call returned %v", err)
	}
	return err
}

// TestLostReply: a write whose request reached Cassandra but whose reply
// was lost, the connection closing (with a FIN or a reset), is
// ErrCommitUnknown — never success, never ErrConditionNotMet — and took
// effect in full; a write whose request was lost is ErrCommitUnknown too
// (the client cannot tell the two apart) and took no effect.
func TestLostReply(t *testing.T) {
	ctx := context.Background()
	db, p := proxied(t)
	direct, tb := newDB(t, testConfig(t))
	// Each statement shape once before its fault, so that the faulty
	// request is the write itself, not the driver's PREPARE of it.
	for c := int64(100); c < 103; c++ {
		if err := db.Put(ctx, put(tb, c, V{"i": storage.BigInt(c)}, nil)); err != nil {
			t.Fatal(err)
		}
		if err := db.Put(ctx, put(tb, c, V{"i": storage.BigInt(c)}, storage.If(storage.Eq("i", storage.BigInt(c))))); err != nil {
			t.Fatal(err)
		}
		if err := db.Put(ctx, put(tb, c+10, V{"i": storage.BigInt(c)}, storage.IfNotExists())); err != nil {
			t.Fatal(err)
		}
		if err := db.Mutate(ctx, []storage.Mutation{put(tb, c+20, V{"i": storage.BigInt(c)}, nil), put(tb, c+30, V{"i": storage.BigInt(c)}, nil)}); err != nil {
			t.Fatal(err)
		}
		if err := db.Delete(ctx, del(tb, c+20, nil)); err != nil {
			t.Fatal(err)
		}
	}

	get := func(c int64) (int64, bool) {
		t.Helper()
		row, ok, err := direct.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(c)}})
		if err != nil {
			t.Fatal(err)
		}
		if !ok || row["i"].IsNull() {
			return 0, ok
		}
		return row["i"].AsBigInt(), true
	}
	cases := []struct {
		name  string
		fault fault
		reset bool
	}{
		{"reply lost, FIN", loseReply, false},
		{"reply lost, reset", loseReply, true},
		{"request lost", loseRequest, false},
	}
	for n, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p.reset.Store(tc.reset)
			applied := tc.fault == loseReply
			base := int64(n+1) * 1000
			// Put: a new row, an overwrite, a conditional write whose
			// condition holds, one whose condition fails, a delete and a
			// Mutate of two rows.
			if err := direct.Put(ctx, put(tb, base+2, V{"i": storage.BigInt(1)}, nil)); err != nil {
				t.Fatal(err)
			}
			if err := direct.Put(ctx, put(tb, base+5, V{"i": storage.BigInt(1)}, nil)); err != nil {
				t.Fatal(err)
			}
			steps := []struct {
				what  string
				write func() error
				check func() // the effect, or its absence
			}{
				{"put of a new row", func() error { return db.Put(ctx, put(tb, base+1, V{"i": storage.BigInt(7)}, nil)) }, func() {
					if v, ok := get(base + 1); ok != applied || ok && v != 7 {
						t.Errorf("after a put: %d %v, want applied=%v", v, ok, applied)
					}
				}},
				{"conditional put that holds", func() error {
					return db.Put(ctx, put(tb, base+2, V{"i": storage.BigInt(8)}, storage.If(storage.Eq("i", storage.BigInt(1)))))
				}, func() {
					if v, _ := get(base + 2); (v == 8) != applied {
						t.Errorf("after a conditional put: i=%d, want applied=%v", v, applied)
					}
				}},
				{"put IfNotExists of a row that exists", func() error {
					return db.Put(ctx, put(tb, base+2, V{"i": storage.BigInt(9)}, storage.IfNotExists()))
				}, func() {
					if v, _ := get(base + 2); v == 9 {
						t.Errorf("a put whose condition failed wrote")
					}
				}},
				{"put IfNotExists of a new row", func() error {
					return db.Put(ctx, put(tb, base+3, V{"i": storage.BigInt(3)}, storage.IfNotExists()))
				}, func() {
					if _, ok := get(base + 3); ok != applied {
						t.Errorf("after put IfNotExists: present=%v, want %v", ok, applied)
					}
				}},
				{"mutate of two rows", func() error {
					return db.Mutate(ctx, []storage.Mutation{put(tb, base+4, V{"i": storage.BigInt(4)}, nil), put(tb, base+6, V{"i": storage.BigInt(6)}, nil)})
				}, func() {
					_, a := get(base + 4)
					_, b := get(base + 6)
					if a != applied || b != applied {
						t.Errorf("after a Mutate: rows present %v and %v, want both %v", a, b, applied)
					}
				}},
				{"delete", func() error { return db.Delete(ctx, del(tb, base+5, nil)) }, func() {
					if _, ok := get(base + 5); ok == applied {
						t.Errorf("after a delete: present=%v, want deleted=%v", ok, applied)
					}
				}},
			}
			for _, s := range steps {
				settle(t, func() error {
					_, _, err := db.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(0)}})
					return err
				})
				err := withFault(t, p, tc.fault, s.write)
				if !errors.Is(err, storage.ErrCommitUnknown) {
					t.Errorf("%s: %v, want ErrCommitUnknown", s.what, err)
				}
				s.check()
			}
		})
	}
}

// TestLostReplyCommit: coordinator transactions over Cassandra whose
// replies are lost. A lost reply to the decision (the commit point) or to
// a one-phase commit leaves Commit's outcome unknown (ErrCommitUnknown),
// and the transaction did commit: the next reader rolls it forward. A
// lost reply to a prepare fails the commit with ErrUnavailable, since it
// never decided and so cannot have committed: the next reader after the
// expiry sees none of it.
func TestLostReplyCommit(t *testing.T) {
	ctx := context.Background()
	store, p := proxied(t)
	ns := fmt.Sprintf("lost_%d_%d", time.Now().UnixNano()%1e9, nsSeq.Add(1))
	// The coordinator's own namespace is shared by the runs: transactions
	// are named by random UUIDs.
	const coordNS = "lost_replies_cc"
	var armed atomic.Pointer[func(*storage.Put) bool]
	faulty := armingStore{Store: store, p: p, when: &armed}
	const expiry = time.Second
	db, err := coordinator.Open(ctx, faulty, coordinator.Config{Namespace: coordNS, Expiry: expiry})
	if err != nil {
		t.Fatal(err)
	}
	// A coordinator straight to Cassandra, to read with.
	direct, err := cassandra.Open(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	reader, err := coordinator.Open(ctx, direct, coordinator.Config{Namespace: coordNS, Expiry: expiry})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.DropTable(ctx, ns, "kv"); _ = reader.DropNamespace(ctx, ns) }()
	if err := db.CreateTable(ctx, &storage.Table{Namespace: ns, Name: "kv",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}); err != nil {
		t.Fatal(err)
	}
	key := func(k string) storage.Values { return storage.Values{"k": storage.Text(k)} }
	write := func(v int64, keys ...string) error {
		return storage.UpdateWith(ctx, db, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
			for _, k := range keys {
				if _, _, err := tx.Get(ctx, &storage.Get{Namespace: ns, Table: "kv", Partition: key(k)}); err != nil {
					return err
				}
				if err := tx.Put(ctx, &storage.Put{Namespace: ns, Table: "kv", Partition: key(k), Values: storage.Values{"v": storage.BigInt(v)}}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	read := func(keys ...string) []int64 {
		t.Helper()
		var out []int64
		err := storage.Update(ctx, reader, func(tx storage.Txn) error {
			out = out[:0]
			for _, k := range keys {
				row, _, err := tx.Get(ctx, &storage.Get{Namespace: ns, Table: "kv", Partition: key(k)})
				if err != nil {
					return err
				}
				out = append(out, row["v"].AsBigInt())
			}
			return nil
		})
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return out
	}
	// raw is a row as the store holds it: its state and transaction.
	raw := func(k string) storage.Row {
		t.Helper()
		row, _, err := direct.Get(ctx, &storage.Get{Namespace: ns, Table: "kv", Partition: key(k)})
		if err != nil {
			t.Fatal(err)
		}
		return row
	}
	// Every statement shape once, unharmed.
	if err := write(1, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := write(1, "c"); err != nil {
		t.Fatal(err)
	}
	arm := func(f func(*storage.Put) bool) {
		settle(t, func() error {
			_, _, err := store.Get(ctx, &storage.Get{Namespace: ns, Table: "kv", Partition: key("a")})
			return err
		})
		armed.Store(&f)
	}
	isState := func(p *storage.Put) bool { return p.Namespace == coordNS }

	// The decision's reply lost: committed, and rolled forward by a reader.
	arm(isState)
	err = write(2, "a", "b")
	armed.Store(nil)
	if !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("commit whose decision's reply was lost: %v, want ErrCommitUnknown", err)
	}
	if r := raw("a"); r["cc_state"].AsBigInt() != 2 {
		t.Fatalf("after the decision's lost reply, row a is %v: want it still prepared (state 2), left to the reader", r)
	}
	if got := read("a", "b"); got[0] != 2 || got[1] != 2 {
		t.Fatalf("after a commit whose decision's reply was lost: %v, want the decided transaction rolled forward (2 2)", got)
	}
	if r := raw("a"); r["cc_state"].AsBigInt() != 1 || r["v"].AsBigInt() != 2 {
		t.Fatalf("after the reader: row a is %v, want committed (state 1) with v=2", r)
	}

	// A one-phase commit's reply lost: committed.
	arm(func(p *storage.Put) bool { return !isState(p) })
	err = write(2, "c")
	armed.Store(nil)
	if !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("one-phase commit whose reply was lost: %v, want ErrCommitUnknown", err)
	}
	if got := read("c"); got[0] != 2 {
		t.Fatalf("after a one-phase commit whose reply was lost: %v, want 2", got)
	}

	// The first prepare's reply lost: never decided committed; once it
	// expires, a reader rolls back whatever it prepared.
	var once atomic.Bool
	arm(func(p *storage.Put) bool { return !isState(p) && once.CompareAndSwap(false, true) })
	err = write(3, "a", "b")
	armed.Store(nil)
	if !errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("commit whose prepare's reply was lost: %v, want ErrUnavailable: it never decided, so it did not commit", err)
	}
	time.Sleep(expiry)
	if got := read("a", "b"); got[0] != 2 || got[1] != 2 {
		t.Fatalf("after a commit whose prepare's reply was lost: %v, want none of it (2 2)", got)
	}
}

// armingStore arms its proxy with loseReply for the puts when says to, and
// checks that each such put met the fault.
type armingStore struct {
	storage.Store
	p    *proxy
	when *atomic.Pointer[func(*storage.Put) bool]
}

func (s armingStore) Put(ctx context.Context, p *storage.Put) error {
	f := s.when.Load()
	if f == nil || !(*f)(p) {
		return s.Store.Put(ctx, p)
	}
	s.p.reset.Store(false)
	before := s.p.cut.Load()
	s.p.arm(loseReply)
	err := s.Store.Put(ctx, p)
	s.p.arm(passThrough)
	if s.p.cut.Load() == before {
		return errors.New("test: the armed proxy cut no connection (the driver went around it?)")
	}
	return err
}
