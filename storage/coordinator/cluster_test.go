package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/storage/coordinator"
)

// A transfer's outcome, by its error.
type outcome int

const (
	acked       outcome = iota // committed
	unknown                    // ErrCommitUnknown: committed or not
	unavailable                // ErrUnavailable: not committed
	conflicted                 // ErrConflict, retries exhausted: not committed
	untyped                    // anything else: a bug
)

func (o outcome) String() string {
	return [...]string{"acked", "unknown", "unavailable", "conflict", "untyped"}[o]
}

func classify(err error) outcome {
	switch {
	case err == nil:
		return acked
	case errors.Is(err, storage.ErrCommitUnknown):
		return unknown
	case errors.Is(err, storage.ErrUnavailable):
		return unavailable
	case errors.Is(err, storage.ErrConflict):
		return conflicted
	}
	return untyped
}

// transfer is one attempted transfer and what became of it.
type transfer struct {
	worker, seq      int64
	from, to, amount int64
	start, end       time.Time
	err              error
}

const (
	bankAccounts = 16
	bankInitial  = 1000
)

// bank is the workload of TestClusterNodeFailures: transfers between
// accounts, each also recording itself in a ledger row (worker, seq), in
// one coordinator transaction. The tables are kept from run to run (a
// schema change on three nodes is slow); each run has its own rows.
type bank struct {
	db    *coordinator.DB
	ns    string
	runID string

	mu        sync.Mutex
	transfers []transfer
}

func (b *bank) create(ctx context.Context) error {
	err := storage.EnsureTables(ctx, b.db, b.ns, []*storage.Table{
		{Namespace: b.ns, Name: "accounts",
			PartitionKey: []storage.Column{{Name: "run", Type: storage.TypeText}, {Name: "id", Type: storage.TypeBigInt}},
			Columns:      []storage.Column{{Name: "balance", Type: storage.TypeBigInt}}},
		{Namespace: b.ns, Name: "ledger",
			PartitionKey:  []storage.Column{{Name: "run", Type: storage.TypeText}, {Name: "worker", Type: storage.TypeBigInt}},
			ClusteringKey: []storage.ClusteringColumn{{Name: "seq", Type: storage.TypeBigInt}},
			Columns: []storage.Column{{Name: "src", Type: storage.TypeBigInt}, {Name: "dst", Type: storage.TypeBigInt},
				{Name: "amount", Type: storage.TypeBigInt}}},
	})
	if err != nil {
		return err
	}
	return storage.Update(ctx, b.db, func(tx storage.Txn) error {
		for id := range int64(bankAccounts) {
			if err := tx.Put(ctx, b.account(id, bankInitial)); err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *bank) account(id, balance int64) *storage.Put {
	return &storage.Put{Namespace: b.ns, Table: "accounts", Partition: storage.Values{"run": storage.Text(b.runID), "id": storage.BigInt(id)},
		Values: storage.Values{"balance": storage.BigInt(balance)}}
}

func (b *bank) balance(ctx context.Context, tx storage.Txn, id int64) (int64, error) {
	row, ok, err := tx.Get(ctx, &storage.Get{Namespace: b.ns, Table: "accounts", Partition: storage.Values{"run": storage.Text(b.runID), "id": storage.BigInt(id)}})
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("account %d is missing", id)
	}
	return row["balance"].AsBigInt(), nil
}

// transfer moves tr.amount from tr.from to tr.to and records it.
func (b *bank) transfer(ctx context.Context, tr transfer) error {
	return storage.UpdateWith(ctx, b.db, storage.RetryPolicy{MaxAttempts: 4, MaxDelay: 50 * time.Millisecond}, func(tx storage.Txn) error {
		from, err := b.balance(ctx, tx, tr.from)
		if err != nil {
			return err
		}
		to, err := b.balance(ctx, tx, tr.to)
		if err != nil {
			return err
		}
		if err := tx.Put(ctx, b.account(tr.from, from-tr.amount)); err != nil {
			return err
		}
		if err := tx.Put(ctx, b.account(tr.to, to+tr.amount)); err != nil {
			return err
		}
		return tx.Put(ctx, &storage.Put{Namespace: b.ns, Table: "ledger",
			Partition: storage.Values{"run": storage.Text(b.runID), "worker": storage.BigInt(tr.worker)}, Clustering: storage.Values{"seq": storage.BigInt(tr.seq)},
			Values:    storage.Values{"src": storage.BigInt(tr.from), "dst": storage.BigInt(tr.to), "amount": storage.BigInt(tr.amount)},
			Condition: storage.IfNotExists()})
	})
}

// run runs workers transferring until stop is closed; the transfers of
// worker w are numbered from first.
func (b *bank) run(ctx context.Context, workers int, first int64, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for w := range int64(workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(first)))
			for seq := first; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				tr := transfer{worker: w, seq: seq, from: rng.Int64N(bankAccounts), amount: 1 + rng.Int64N(100)}
				tr.to = (tr.from + 1 + rng.Int64N(bankAccounts-1)) % bankAccounts
				tr.start = time.Now()
				tr.err = b.transfer(ctx, tr)
				tr.end = time.Now()
				b.mu.Lock()
				b.transfers = append(b.transfers, tr)
				b.mu.Unlock()
				if tr.err != nil {
					time.Sleep(20 * time.Millisecond) // a failing cluster: do not spin
				}
			}
		}()
	}
	wg.Wait()
}

// check reads every account and the ledger, resolving what transfers left
// prepared, and checks: every acknowledged transfer is in the ledger,
// none that failed without ErrCommitUnknown is, the balances are exactly
// the initial ones moved by the transfers in the ledger, and so their
// total is conserved.
func (b *bank) check(t *testing.T, ctx context.Context, workers int) {
	t.Helper()
	balances := make([]int64, bankAccounts)
	ledger := map[[2]int64]storage.Row{}
	err := storage.Update(ctx, b.db, func(tx storage.Txn) error {
		for id := range int64(bankAccounts) {
			v, err := b.balance(ctx, tx, id)
			if err != nil {
				return err
			}
			balances[id] = v
		}
		clear(ledger)
		for w := range int64(workers) {
			rows, err := tx.Scan(ctx, &storage.Scan{Namespace: b.ns, Table: "ledger", Partition: storage.Values{"run": storage.Text(b.runID), "worker": storage.BigInt(w)}})
			if err != nil {
				return err
			}
			all, err := storage.CollectRows(rows)
			if err != nil {
				return err
			}
			for _, r := range all {
				ledger[[2]int64{w, r["seq"].AsBigInt()}] = r
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the bank: %v", err)
	}
	want := make([]int64, bankAccounts)
	for i := range want {
		want[i] = bankInitial
	}
	for _, r := range ledger {
		want[r["src"].AsBigInt()] -= r["amount"].AsBigInt()
		want[r["dst"].AsBigInt()] += r["amount"].AsBigInt()
	}
	var total int64
	for i, v := range balances {
		total += v
		if v != want[i] {
			t.Errorf("account %d holds %d; the transfers in the ledger make it %d", i, v, want[i])
		}
	}
	if total != bankAccounts*bankInitial {
		t.Errorf("the accounts hold %d in all, want %d", total, bankAccounts*bankInitial)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	unknownIn := 0
	for _, tr := range b.transfers {
		r, in := ledger[[2]int64{tr.worker, tr.seq}]
		switch o := classify(tr.err); {
		case o == acked && !in:
			t.Errorf("acknowledged transfer %d/%d is not in the ledger", tr.worker, tr.seq)
		case o == acked && (r["src"].AsBigInt() != tr.from || r["dst"].AsBigInt() != tr.to || r["amount"].AsBigInt() != tr.amount):
			t.Errorf("transfer %d/%d is in the ledger as %v, want %d→%d %d", tr.worker, tr.seq, r, tr.from, tr.to, tr.amount)
		case o == unknown && in:
			unknownIn++
		case o != acked && o != unknown && in:
			t.Errorf("transfer %d/%d failed (%v), yet it is in the ledger", tr.worker, tr.seq, tr.err)
		}
	}
	if extra := len(ledger) - b.count(acked) - unknownIn; extra != 0 {
		t.Errorf("the ledger holds %d transfers nobody attempted", extra)
	}
	t.Logf("bank checked: %d transfers in the ledger (%d of them of unknown outcome), total %d", len(ledger), unknownIn, total)
}

// count is the number of transfers with outcome o; b.mu is held.
func (b *bank) count(o outcome) int {
	n := 0
	for _, tr := range b.transfers {
		if classify(tr.err) == o {
			n++
		}
	}
	return n
}

// between tallies the outcomes of the transfers that started in [from, to).
func (b *bank) between(from, to time.Time) map[outcome]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[outcome]int{}
	for _, tr := range b.transfers {
		if !tr.start.Before(from) && tr.start.Before(to) {
			out[classify(tr.err)]++
		}
	}
	return out
}

// TestClusterNodeFailures runs a bank of coordinator transactions on a
// three-node Cassandra cluster (replication 3, QUORUM writes, SERIAL
// Paxos and reads) while nodes fail. With one node killed, transfers keep
// committing. With two killed, nothing can: every transfer and read fails
// with a typed error — ErrUnavailable, or ErrCommitUnknown for a write in
// flight — and none succeeds. Once the nodes are back, every acknowledged
// transfer is in the ledger, no transfer that failed otherwise is, and the
// balances are exactly what the ledger's transfers make them (the total
// conserved), after readers resolved what the failures left prepared.
func TestClusterNodeFailures(t *testing.T) {
	contactList, state := testenv.CassandraCluster(t)
	ctx := context.Background()
	cs, err := cassandra.Open(ctx, cassandra.Config{Contacts: strings.Split(contactList, ","), Keyspace: "kiroku_cluster",
		ReplicationFactor: 3, Consistency: "QUORUM", SerialConsistency: "SERIAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() }) // after the cleanup below
	const expiry = 2 * time.Second
	db, err := coordinator.Open(ctx, cs, coordinator.Config{Namespace: "cluster_cc", Expiry: expiry})
	if err != nil {
		t.Fatal(err)
	}
	b := &bank{db: db, ns: "bank", runID: fmt.Sprint(time.Now().UnixNano())}
	if err := b.create(ctx); err != nil {
		t.Fatal(err)
	}

	// Nodes this test stopped are started again, whatever happens.
	var down []string
	node := func(args ...string) {
		t.Helper()
		start := time.Now()
		if err := testenv.CassandraScript(state, args...); err != nil {
			t.Fatal(err)
		}
		t.Logf("cassandra.sh %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	}
	t.Cleanup(func() {
		if len(down) > 0 {
			if err := testenv.CassandraScript(state, append([]string{"start-node"}, down...)...); err != nil {
				t.Error(err)
			}
		}
	})

	const workers = 4
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.run(ctx, workers, 0, stop)
	}()
	time.Sleep(2 * time.Second)

	// One node down: QUORUM is two of three.
	down = append(down, "3")
	node("stop-node", "3")
	k1 := time.Now()
	time.Sleep(10 * time.Second)

	// Two nodes down: no quorum.
	down = append(down, "2")
	node("stop-node", "2")
	k2 := time.Now()
	err = storage.UpdateWith(ctx, db, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
		_, err := b.balance(ctx, tx, 0)
		return err
	})
	if !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("a read with two of three nodes down: %v, want ErrUnavailable", err)
	}
	time.Sleep(6 * time.Second)
	close(stop)
	<-done
	end := time.Now()

	one, two := b.between(k1, k2), b.between(k2, end)
	t.Logf("one node down, %v: %v; two nodes down, %v: %v", k2.Sub(k1).Round(time.Millisecond), one, end.Sub(k2).Round(time.Millisecond), two)
	if one[acked] < 5 {
		t.Errorf("with one node down, %d transfers committed: want them to keep committing", one[acked])
	}
	if two[acked] > 0 {
		t.Errorf("with two of three nodes down, %d transfers committed", two[acked])
	}
	if two[unavailable]+two[unknown] == 0 {
		t.Errorf("with two nodes down, no transfer failed with ErrUnavailable or ErrCommitUnknown: %v", two)
	}
	b.mu.Lock()
	for _, tr := range b.transfers {
		if classify(tr.err) == untyped {
			t.Errorf("transfer %d/%d failed with an untyped error: %v", tr.worker, tr.seq, tr.err)
		}
	}
	b.mu.Unlock()

	// Both nodes back.
	node("start-node", "2", "3")
	down = nil
	back := time.Now()
	for {
		err := storage.UpdateWith(ctx, db, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
			_, err := b.balance(ctx, tx, 0)
			return err
		})
		if err == nil || errors.Is(err, storage.ErrConflict) {
			break
		}
		if time.Since(back) > 2*time.Minute {
			t.Fatalf("the cluster is back and reads still fail: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("reads succeed %v after the nodes are back", time.Since(back).Round(time.Millisecond))
	// What the failures left prepared expires, and readers resolve it.
	time.Sleep(expiry)
	stop = make(chan struct{})
	done = make(chan struct{})
	go func() {
		defer close(done)
		b.run(ctx, workers, 1<<32, stop)
	}()
	time.Sleep(3 * time.Second)
	close(stop)
	<-done
	after := b.between(back, time.Now())
	t.Logf("nodes back: %v", after)
	if after[acked] == 0 {
		t.Errorf("with every node back, no transfer committed: %v", after)
	}
	b.check(t, ctx, workers)
}
