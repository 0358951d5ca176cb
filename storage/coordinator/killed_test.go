package coordinator_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/storage/coordinator"
)

// The child process of TestKilledClient: the env var says where it stops
// ("prepared" or "decided") and which namespace it writes.
const (
	killedChildEnv = "KIROKU_TEST_COORDINATOR_CHILD"
	killedNSEnv    = "KIROKU_TEST_COORDINATOR_NS"
	// killedCoordNS is the coordinator's namespace, shared by the runs:
	// transactions are named by random UUIDs.
	killedCoordNS = "killed_cc"
)

// TestKilledClient: a client process is killed (SIGKILL) in the middle of
// a coordinator transaction over Cassandra that writes two rows. Killed
// after preparing them and before its decision, the transaction is left
// alone until it expires, then a reader rolls it back and sees the rows'
// before-images; killed right after its decision "committed", a reader
// rolls it forward at once.
func TestKilledClient(t *testing.T) {
	if mode := os.Getenv(killedChildEnv); mode != "" {
		killedChild(t, mode, os.Getenv(killedNSEnv))
		return
	}
	contacts := strings.Split(testenv.CassandraContacts(t), ",")
	ctx := context.Background()
	cs, err := cassandra.Open(ctx, cassandra.Config{Contacts: contacts})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	const expiry = 3 * time.Second
	db, err := coordinator.Open(ctx, cs, coordinator.Config{Namespace: killedCoordNS, Expiry: expiry})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"prepared", "decided"} {
		t.Run(mode, func(t *testing.T) {
			ns := fmt.Sprintf("killed_%s_%d", mode, time.Now().UnixNano()%1e9)
			if err := db.CreateNamespace(ctx, ns); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = db.DropTable(ctx, ns, "kv"); _ = db.DropNamespace(ctx, ns) }()
			if err := db.CreateTable(ctx, kvTable(ns)); err != nil {
				t.Fatal(err)
			}
			if err := writeKV(ctx, db, ns, 1); err != nil {
				t.Fatal(err)
			}

			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledClient$", "-test.count=1")
			cmd.Env = append(os.Environ(), killedChildEnv+"="+mode, killedNSEnv+"="+ns)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line := make(chan string, 1)
			go func() {
				s, _ := bufio.NewReader(out).ReadString('\n')
				line <- s
			}()
			select {
			case s := <-line:
				if s != mode+"\n" {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					t.Fatalf("the child said %q, want %q; its stderr:\n%s", s, mode, stderr.String())
				}
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("the child did not reach %q; its stderr:\n%s", mode, stderr.String())
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var ee *exec.ExitError
			if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the child ended with %v, want killed by SIGKILL", err)
			}

			// What the child left: both rows prepared by one transaction,
			// and its decision, if any.
			tx, prepared := "", int64(0)
			for _, k := range []string{"a", "b"} {
				row := rawRow(t, cs, ns, k)
				if row["cc_state"].AsBigInt() != 2 || row["v"].AsBigInt() != 2 || tx != "" && row["cc_tx"].AsText() != tx {
					t.Fatalf("row %s after the kill: %v, want prepared (cc_state 2) with v=2 by the child's transaction", k, row)
				}
				tx, prepared = row["cc_tx"].AsText(), row["cc_prepared"].AsBigInt()
			}
			want := map[string]int64{"prepared": 0, "decided": 1}[mode]
			if d := decision(t, cs, tx); d != want {
				t.Fatalf("the killed transaction's decision is %d, want %d", d, want)
			}

			if mode == "prepared" {
				// Not expired: a reader must not decide for it.
				_, _, err := readKV(ctx, db, ns)
				if age := time.Since(time.UnixMicro(prepared)); age < expiry {
					if !errors.Is(err, storage.ErrConflict) {
						t.Fatalf("reading rows of an undecided transaction prepared %v ago (expiry %v): %v, want a conflict", age, expiry, err)
					}
				} else {
					t.Logf("the first read came %v after the prepare, past the expiry: not checked", age)
				}
				time.Sleep(time.Until(time.UnixMicro(prepared).Add(expiry)))
			}
			a, b, err := readKV(ctx, db, ns)
			wantV := map[string]int64{"prepared": 1, "decided": 2}[mode]
			if err != nil || a != wantV || b != wantV {
				t.Fatalf("reading after the kill: a=%d b=%d %v, want %d %d", a, b, err, wantV, wantV)
			}
			// The reader finished the transaction: each row committed, or
			// still prepared by the transaction whose decision says
			// committed (which is committed: readers take it as it is),
			// and the decision recorded.
			for _, k := range []string{"a", "b"} {
				row := rawRow(t, cs, ns, k)
				committed := row["cc_state"].AsBigInt() == 1 ||
					row["cc_state"].AsBigInt() == 2 && decision(t, cs, row["cc_tx"].AsText()) == 1
				if !committed || row["v"].AsBigInt() != wantV {
					t.Fatalf("row %s after the reader: %v, want committed with v=%d", k, row, wantV)
				}
			}
			if d := decision(t, cs, tx); d != map[string]int64{"prepared": 2, "decided": 1}[mode] {
				t.Fatalf("the killed transaction's decision after the reader: %d", d)
			}
		})
	}
}

// killedChild writes v=2 to rows a and b of ns in one transaction, says
// mode on stdout when it reaches it and waits there to be killed.
func killedChild(t *testing.T, mode, ns string) {
	ctx := context.Background()
	cs, err := cassandra.Open(ctx, cassandra.Config{Contacts: strings.Split(testenv.CassandraContacts(t), ",")})
	if err != nil {
		t.Fatal(err)
	}
	db, err := coordinator.Open(ctx, &stoppingStore{Store: cs, mode: mode}, coordinator.Config{Namespace: killedCoordNS})
	if err != nil {
		t.Fatal(err)
	}
	err = writeKV(ctx, db, ns, 2)
	t.Fatalf("the child's transaction ended (%v) instead of stopping at %q", err, mode)
}

// stoppingStore stops the process at a point of a commit, as a client
// killed there: "prepared" at the decision's write, "decided" right after
// the decision was written (a commit writes its rows no more after it).
type stoppingStore struct {
	storage.Store
	mode string
}

func (s *stoppingStore) Put(ctx context.Context, p *storage.Put) error {
	state := p.Namespace == killedCoordNS
	if s.mode == "prepared" && state {
		stop(s.mode)
	}
	err := s.Store.Put(ctx, p)
	if s.mode == "decided" && state && err == nil {
		stop(s.mode)
	}
	return err
}

// stop says where the child stopped and waits to be killed.
func stop(mode string) {
	os.Stdout.WriteString(mode + "\n")
	// Until killed; a child its parent failed to kill still exits.
	time.Sleep(2 * time.Minute)
	os.Exit(3)
}

func kvTable(ns string) *storage.Table {
	return &storage.Table{Namespace: ns, Name: "kv",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}
}

func kvKey(k string) storage.Values { return storage.Values{"k": storage.Text(k)} }

// writeKV sets rows a and b to v in one transaction.
func writeKV(ctx context.Context, db storage.Beginner, ns string, v int64) error {
	return storage.Update(ctx, db, func(tx storage.Txn) error {
		for _, k := range []string{"a", "b"} {
			if err := tx.Put(ctx, &storage.Put{Namespace: ns, Table: "kv", Partition: kvKey(k), Values: storage.Values{"v": storage.BigInt(v)}}); err != nil {
				return err
			}
		}
		return nil
	})
}

// readKV reads rows a and b in one transaction, tried once.
func readKV(ctx context.Context, db storage.Beginner, ns string) (a, b int64, err error) {
	err = storage.UpdateWith(ctx, db, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
		ra, _, err := tx.Get(ctx, &storage.Get{Namespace: ns, Table: "kv", Partition: kvKey("a")})
		if err != nil {
			return err
		}
		rb, _, err := tx.Get(ctx, &storage.Get{Namespace: ns, Table: "kv", Partition: kvKey("b")})
		if err != nil {
			return err
		}
		a, b = ra["v"].AsBigInt(), rb["v"].AsBigInt()
		return nil
	})
	return a, b, err
}

// rawRow is a row as the store holds it, with the coordinator's columns.
func rawRow(t *testing.T, s storage.Store, ns, k string) storage.Row {
	t.Helper()
	row, ok, err := s.Get(context.Background(), &storage.Get{Namespace: ns, Table: "kv", Partition: kvKey(k)})
	if err != nil || !ok {
		t.Fatalf("raw read of row %s: %v %v", k, ok, err)
	}
	return row
}

// decision is a transaction's recorded decision: 0 none, 1 committed, 2
// aborted.
func decision(t *testing.T, s storage.Store, tx string) int64 {
	t.Helper()
	row, ok, err := s.Get(context.Background(), &storage.Get{Namespace: killedCoordNS, Table: "state", Partition: storage.Values{"tx": storage.Text(tx)}})
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return 0
	}
	return row["decision"].AsBigInt()
}
