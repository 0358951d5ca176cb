package cassandra_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

// contacts returns the test Cassandra's contact points (testenv).
func contacts(t testing.TB) []string {
	t.Helper()
	return strings.Split(testenv.CassandraContacts(t), ",")
}

// testConfig is the configuration of the tests' DBs: short timeouts, so
// that a broken server fails the suite quickly.
func testConfig(t testing.TB) cassandra.Config {
	return cassandra.Config{Contacts: contacts(t), Keyspace: "kiroku_test", Timeout: 10 * time.Second, ConnectTimeout: 5 * time.Second}
}

func open(t *testing.T) storage.Store {
	t.Helper()
	db, err := cassandra.Open(context.Background(), testConfig(t))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return db
}

func TestConformance(t *testing.T) {
	contacts(t)
	storagetest.RunStore(t, open)
}

// TestOpenUnreachable: a cluster that cannot be reached is ErrUnavailable.
func TestOpenUnreachable(t *testing.T) {
	_, err := cassandra.Open(context.Background(), cassandra.Config{Contacts: []string{"127.0.0.1:1"}, ConnectTimeout: time.Second})
	if !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("open of a closed port: %v, want ErrUnavailable", err)
	}
}

// TestConformanceSmallPages runs the store suite again with pages of three
// rows, so that scans filtered at a mixed-direction bound, limits and
// early closes cross page boundaries, and with reads at QUORUM instead of
// SERIAL.
func TestConformanceSmallPages(t *testing.T) {
	cfg := testConfig(t)
	cfg.PageSize = 3
	cfg.ReadConsistency = "QUORUM"
	storagetest.RunStore(t, func(t *testing.T) storage.Store {
		db, err := cassandra.Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		return db
	})
}

type V = storage.Values

var nsSeq atomic.Int64

// newDB opens a DB with a private namespace holding table "t" (partition
// key k, clustering key c, value columns i and s), dropped at the end.
func newDB(t *testing.T, cfg cassandra.Config) (*cassandra.DB, *storage.Table) {
	t.Helper()
	ctx := context.Background()
	db, err := cassandra.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("cass_%d_%d", time.Now().UnixNano()%1e9, nsSeq.Add(1))
	if err := db.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	tb := &storage.Table{Namespace: ns, Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "c", Type: storage.TypeBigInt, Order: storage.Asc}},
		Columns:       []storage.Column{{Name: "i", Type: storage.TypeBigInt}, {Name: "s", Type: storage.TypeText}}}
	if err := db.CreateTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tables, _ := db.ListTables(ctx, ns)
		for _, name := range tables {
			_ = db.DropTable(ctx, ns, name)
		}
		_ = db.DropNamespace(ctx, ns)
		db.Close()
	})
	return db, tb
}

func put(tb *storage.Table, c int64, vals V, cond *storage.Condition) *storage.Put {
	return &storage.Put{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(c)}, Values: vals, Condition: cond}
}

func del(tb *storage.Table, c int64, cond *storage.Condition) *storage.Delete {
	return &storage.Delete{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(c)}, Condition: cond}
}

// rows returns the partition's rows as "c:i:s" strings.
func rows(t *testing.T, db storage.Store, tb *storage.Table) string {
	t.Helper()
	rs, err := db.Scan(context.Background(), &storage.Scan{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}})
	if err != nil {
		t.Fatal(err)
	}
	all, err := storage.CollectRows(rs)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range all {
		out = append(out, fmt.Sprintf("%v:%v:%v", r["c"], r["i"], r["s"]))
	}
	return strings.Join(out, " ")
}

// TestMutate: a failed condition names its mutation; mutations of one row
// take effect in order; a Skippable put whose condition fails is skipped
// while the rest of the batch applies.
func TestMutate(t *testing.T) {
	ctx := context.Background()
	db, tb := newDB(t, testConfig(t))
	if err := db.Mutate(ctx, []storage.Mutation{put(tb, 1, V{"i": storage.BigInt(1)}, nil), put(tb, 2, V{"i": storage.BigInt(2)}, nil)}); err != nil {
		t.Fatal(err)
	}
	err := db.Mutate(ctx, []storage.Mutation{
		put(tb, 3, V{"i": storage.BigInt(3)}, storage.IfNotExists()),
		put(tb, 1, V{"i": storage.BigInt(10)}, storage.If(storage.Eq("i", storage.BigInt(1)))),
		del(tb, 2, storage.If(storage.Gt("i", storage.BigInt(5)))), // fails: i is 2
		put(tb, 4, nil, storage.IfExists()),                        // fails too, later
	})
	var se *storage.Error
	if !errors.Is(err, storage.ErrConditionNotMet) || !errors.As(err, &se) || !strings.Contains(se.Detail, "mutation 3 of 4") {
		t.Fatalf("failed Mutate: %v, want ErrConditionNotMet naming mutation 3 of 4", err)
	}
	// A condition on a key column that does not hold is named too.
	err = db.Mutate(ctx, []storage.Mutation{put(tb, 3, nil, nil), put(tb, 5, nil, storage.If(storage.Eq("c", storage.BigInt(6))))})
	if !errors.As(err, &se) || !errors.Is(err, storage.ErrConditionNotMet) || !strings.Contains(se.Detail, "mutation 2 of 2") {
		t.Fatalf("failed key condition: %v", err)
	}
	if got, want := rows(t, db, tb), "1:1:NULL 2:2:NULL"; got != want {
		t.Fatalf("after failed Mutates: %s, want %s", got, want)
	}
	// One row, several mutations: in order.
	err = db.Mutate(ctx, []storage.Mutation{
		put(tb, 1, V{"s": storage.Text("a")}, storage.IfExists()), put(tb, 1, V{"s": storage.Text("b"), "i": storage.Null()}, nil),
		del(tb, 2, nil), put(tb, 2, V{"s": storage.Text("c")}, nil),
		put(tb, 3, V{"i": storage.BigInt(3)}, nil), del(tb, 3, nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rows(t, db, tb), `1:NULL:"b" 2:NULL:"c"`; got != want {
		t.Fatalf("after Mutate of repeated rows: %s, want %s", got, want)
	}
	err = db.Mutate(ctx, []storage.Mutation{put(tb, 1, nil, nil), put(tb, 1, nil, storage.IfExists())})
	if !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("condition on a row written earlier in the Mutate: %v, want ErrInvalidArgument", err)
	}

	// Skippable.
	skip := func(c int64, vals V, cond *storage.Condition) *storage.Put {
		p := put(tb, c, vals, cond)
		p.Skippable = true
		return p
	}
	if err := db.Put(ctx, skip(1, V{"i": storage.BigInt(9)}, storage.IfNotExists())); err != nil {
		t.Fatalf("skipped put: %v", err)
	}
	err = db.Mutate(ctx, []storage.Mutation{
		skip(1, V{"i": storage.BigInt(9)}, storage.If(storage.Eq("s", storage.Text("zz")))), // skipped: s is "b"
		skip(7, V{"i": storage.BigInt(9)}, storage.IfExists()),                              // skipped: no row
		skip(2, V{"i": storage.BigInt(2)}, storage.If(storage.Eq("s", storage.Text("c")))),  // applies
		skip(8, V{"i": storage.BigInt(8)}, storage.If(storage.Eq("c", storage.BigInt(0)))),  // skipped: key
		put(tb, 6, V{"i": storage.BigInt(6)}, nil),
	})
	if err != nil {
		t.Fatalf("Mutate with skipped puts: %v", err)
	}
	if got, want := rows(t, db, tb), `1:NULL:"b" 2:2:"c" 6:6:NULL`; got != want {
		t.Fatalf("after Mutate with skipped puts: %s, want %s", got, want)
	}
	// A non-skippable failure still fails everything.
	err = db.Mutate(ctx, []storage.Mutation{skip(1, nil, storage.IfNotExists()), put(tb, 9, nil, storage.IfExists())})
	if !errors.As(err, &se) || !errors.Is(err, storage.ErrConditionNotMet) || !strings.Contains(se.Detail, "mutation 2 of 2") {
		t.Fatalf("Mutate with a skipped and a failed put: %v", err)
	}

	// A Mutate is one mutation: held to MaxWriteSize as a whole.
	cfg := testConfig(t)
	cfg.Limits = storage.Limits{MaxValueSize: 1000, MaxWriteSize: 2000}
	small, err := cassandra.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	big := V{"s": storage.Text(strings.Repeat("x", 900))}
	err = small.Mutate(ctx, []storage.Mutation{put(tb, 11, big, nil), put(tb, 12, big, nil), put(tb, 13, big, nil)})
	if !errors.Is(err, storage.ErrTooLarge) {
		t.Fatalf("Mutate over MaxWriteSize: %v, want ErrTooLarge", err)
	}
}

// TestSchemaReplacedByAnotherProcess: one process caches a table's schema,
// another drops the table and creates it again with other types. The first
// must notice, reload the schema and judge its request by the new one.
func TestSchemaReplacedByAnotherProcess(t *testing.T) {
	ctx := context.Background()
	a, tb := newDB(t, testConfig(t))
	b, err := cassandra.Open(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Put(ctx, put(tb, 1, V{"i": storage.BigInt(1)}, nil)); err != nil { // a caches i BIGINT
		t.Fatal(err)
	}
	if err := b.DropTable(ctx, tb.Namespace, tb.Name); err != nil {
		t.Fatal(err)
	}
	re := tb.Clone()
	re.Columns = []storage.Column{{Name: "i", Type: storage.TypeText}}
	if err := b.CreateTable(ctx, re); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, put(tb, 1, V{"i": storage.BigInt(2)}, nil)); !errors.Is(err, storage.ErrTypeMismatch) {
		t.Fatalf("put by the stale schema: %v, want ErrTypeMismatch under the new schema", err)
	}
	if err := a.Put(ctx, put(tb, 1, V{"i": storage.Text("two")}, nil)); err != nil {
		t.Fatalf("put under the new schema: %v", err)
	}
	row, ok, err := b.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(1)}})
	if err != nil || !ok || row["i"].AsText() != "two" {
		t.Fatalf("read back: %v %v %v", row, ok, err)
	}
}

// TestRollForward: DDL left half done by a process that died is finished
// by the next process that meets it.
func TestRollForward(t *testing.T) {
	ctx := context.Background()
	db, tb := newDB(t, testConfig(t))
	half := &storage.Table{Namespace: tb.Namespace, Name: "half", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}}}
	if err := cassandra.ClaimOnly(ctx, db, half); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, half); !errors.Is(err, storage.ErrTableExists) {
		t.Fatalf("create of a half-created table: %v, want ErrTableExists", err)
	}
	other, err := cassandra.Open(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// The other process finishes the creation when it first uses the table.
	if err := other.Put(ctx, &storage.Put{Namespace: half.Namespace, Table: half.Name, Partition: V{"k": storage.BigInt(1)}}); err != nil {
		t.Fatalf("put into a half-created table: %v", err)
	}
	rels, err := cassandra.Relations(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	n := len(rels)
	// A drop left half done: the table is gone for everyone, and the
	// namespace's drop finishes it.
	if err := cassandra.MarkDropping(ctx, db, half.Namespace, half.Name); err != nil {
		t.Fatal(err)
	}
	tables, err := other.ListTables(ctx, half.Namespace)
	if err != nil || strings.Join(tables, ",") != "t" {
		t.Fatalf("ListTables with a half-dropped table: %v %v", tables, err)
	}
	if err := db.DropTable(ctx, tb.Namespace, tb.Name); err != nil {
		t.Fatal(err)
	}
	if err := other.DropNamespace(ctx, half.Namespace); err != nil {
		t.Fatalf("drop of a namespace with a half-dropped table: %v", err)
	}
	if rels, err = cassandra.Relations(ctx, db); err != nil || len(rels) != n-2 {
		t.Fatalf("CQL tables after the drops: %v (%v), want %d", rels, err, n-2)
	}
}

// TestConcurrentIncrements: writers race to increment one counter with
// conditional puts (If i = what they read), while others overwrite another
// column of the same row unconditionally. Every write is a lightweight
// transaction, so no increment is lost and none is applied twice.
func TestConcurrentIncrements(t *testing.T) {
	ctx := context.Background()
	db, tb := newDB(t, testConfig(t))
	if err := db.Put(ctx, put(tb, 0, V{"i": storage.BigInt(0)}, nil)); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 15
	var done, unknown atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*writers)
	for w := range writers {
		wg.Add(2)
		go func() { // the incrementer
			defer wg.Done()
			for n := 0; n < each; {
				row, _, err := db.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(0)}})
				if err != nil {
					errs <- err
					return
				}
				cur := row["i"].AsBigInt()
				err = db.Put(ctx, put(tb, 0, V{"i": storage.BigInt(cur + 1)}, storage.If(storage.Eq("i", storage.BigInt(cur)))))
				switch {
				case err == nil:
					done.Add(1)
					n++
				case errors.Is(err, storage.ErrCommitUnknown):
					unknown.Add(1) // Paxos contention: applied or not
					n++
				case !errors.Is(err, storage.ErrConditionNotMet):
					errs <- err
					return
				}
			}
		}()
		go func() { // the overwriter
			defer wg.Done()
			for n := range each {
				err := db.Put(ctx, put(tb, 0, V{"s": storage.Text(fmt.Sprint(w, n))}, nil))
				if err != nil && !errors.Is(err, storage.ErrCommitUnknown) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	row, _, err := db.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(0)}})
	if err != nil {
		t.Fatal(err)
	}
	got := row["i"].AsBigInt()
	if got < done.Load() || got > done.Load()+unknown.Load() {
		t.Fatalf("counter = %d after %d increments (and %d of unknown outcome)", got, done.Load(), unknown.Load())
	}
	t.Logf("counter %d: %d increments, %d of unknown outcome", got, done.Load(), unknown.Load())
}

// TestLargestWrite: a put and a Mutate of MaxWriteSize, the default
// limit, fit in Cassandra's default request and mutation sizes; a request
// over them, with limits set past the server's, is refused with
// ErrTooLarge and writes nothing.
func TestLargestWrite(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	db, tb := newDB(t, cfg)
	lim := db.Limits()
	if lim.MaxWriteSize != 8<<20 || lim.MaxValueSize != 4<<20 {
		t.Fatalf("default limits %+v", lim)
	}
	a := strings.Repeat("a", lim.MaxValueSize)
	b := strings.Repeat("b", lim.MaxWriteSize-lim.MaxValueSize-8) // the key is "" and 8 bytes
	if err := db.Put(ctx, put(tb, 1, V{"s": storage.Text(a), "i": storage.BigInt(1)}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := db.Mutate(ctx, []storage.Mutation{put(tb, 1, V{"s": storage.Text(b)}, storage.IfExists()), put(tb, 2, V{"s": storage.Text(a[:lim.MaxValueSize-16])}, nil)}); err != nil {
		t.Fatalf("Mutate of MaxWriteSize: %v", err)
	}
	if err := db.Put(ctx, put(tb, 3, V{"s": storage.Text(a + "x")}, nil)); !errors.Is(err, storage.ErrTooLarge) {
		t.Fatalf("put over MaxValueSize: %v", err)
	}
	row, ok, err := db.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(1)}})
	if err != nil || !ok || row["s"].AsText() != b {
		t.Fatalf("read back: %v %v", ok, err)
	}

	cfg.MaxRequestSize = 64 << 20 // more than the server takes
	cfg.Limits = storage.Limits{MaxValueSize: 32 << 20}
	wide, err := cassandra.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	if err := wide.Put(ctx, put(tb, 4, V{"s": storage.Text(strings.Repeat("x", 17<<20))}, nil)); !errors.Is(err, storage.ErrTooLarge) {
		t.Fatalf("put over the server's request size: %v, want ErrTooLarge", err)
	}
	if _, ok, err := db.Get(ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: V{"k": storage.Text("")}, Clustering: V{"c": storage.BigInt(4)}}); err != nil || ok {
		t.Fatalf("a refused put wrote: %v %v", ok, err)
	}
}
