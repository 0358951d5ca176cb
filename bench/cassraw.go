package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// CassRaw is the baseline for the Cassandra backend: the lightweight
// transactions the backend sends for a Put, a conditional Put and a Get,
// sent with the gocql driver straight from the benchmark — the same
// statements on tables of the same shape (the key, the value and the
// hidden "_exists" column), at the same consistency (QUORUM commits,
// SERIAL Paxos rounds and reads), with the same connections per node and
// token-aware routing, and no kiroku layer in between. The gap between
// it and the backend's Store is what kiroku's storage layer costs.
//
// Cassandra has no multi-partition transactions, so the bank has no fair
// equivalent here: Transfer reads both balances at SERIAL and then moves
// the money with two compare-and-sets, one per account, each retried on
// its own until it applies. That is the least a transfer can cost in
// lightweight transactions (2 reads, 2 writes), but it is not atomic: a
// reader may see the money in neither account, and a client that dies
// between the two loses it. The coordinator's transactions pay for
// atomicity and isolation on top of it.
type CassRaw struct {
	Contacts []string // host or host:port, as for the backend
	NumConns int      // connections per node; 0 = 2, the backend's default
	session  *gocql.Session
	ks       string
	stmts    struct{ put, condPut, get, setBalance, read string }
}

func (c *CassRaw) Name() string { return "raw gocql, same LWTs (baseline)" }

func (c *CassRaw) Setup(ctx context.Context, accounts int) error {
	var hosts []string
	port := 9042
	for _, h := range c.Contacts {
		host, p, ok := strings.Cut(h, ":")
		if ok {
			if _, err := fmt.Sscanf(p, "%d", &port); err != nil {
				return fmt.Errorf("bench: contact %q: %w", h, err)
			}
		}
		hosts = append(hosts, host)
	}
	cl := gocql.NewCluster(hosts...)
	cl.Port = port
	cl.Timeout = 12 * time.Second
	cl.ConnectTimeout = 5 * time.Second
	cl.NumConns = c.NumConns
	if cl.NumConns == 0 {
		cl.NumConns = 2
	}
	cl.Consistency = gocql.Quorum
	cl.SerialConsistency = gocql.Serial
	cl.Metadata.CacheMode = gocql.KeyspaceOnly
	cl.PoolConfig.HostSelectionPolicy = gocql.TokenAwareHostPolicy(gocql.RoundRobinHostPolicy())
	var err error
	if c.session, err = cl.CreateSession(); err != nil {
		return err
	}
	c.ks = randomName("benchraw_")
	rf := min(3, max(1, len(c.session.GetHosts())))
	q := func(s string) string { return strings.ReplaceAll(s, "KS", c.ks) }
	for _, s := range []string{
		fmt.Sprintf(`CREATE KEYSPACE KS WITH replication = {'class': 'NetworkTopologyStrategy', 'replication_factor': %d}`, rf),
		`CREATE TABLE KS.kv ("k" bigint PRIMARY KEY, "v" blob, "_exists" boolean)`,
		`CREATE TABLE KS.accounts ("id" bigint PRIMARY KEY, "balance" bigint, "_exists" boolean)`,
	} {
		if err := c.session.Query(q(s)).ExecContext(ctx); err != nil {
			return err
		}
	}
	if err := c.session.AwaitSchemaAgreement(ctx); err != nil {
		return err
	}
	// The backend's statements for the same requests (storage/cassandra,
	// writeCQL and getCQL).
	c.stmts.put = q(`UPDATE KS.kv SET "v" = ?, "_exists" = true WHERE "k" = ? IF "_exists" IN (null, true)`)
	c.stmts.condPut = q(`UPDATE KS.kv SET "v" = ?, "_exists" = true WHERE "k" = ? IF "_exists" = true AND "v" = ?`)
	c.stmts.get = q(`SELECT "k", "v", "_exists" FROM KS.kv WHERE "k" = ?`)
	c.stmts.setBalance = q(`UPDATE KS.accounts SET "balance" = ?, "_exists" = true WHERE "id" = ? IF "_exists" = true AND "balance" = ?`)
	c.stmts.read = q(`SELECT "balance", "_exists" FROM KS.accounts WHERE "id" = ?`)
	// Load the accounts 16 at a time.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	ids := make(chan int64)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				_, err := c.session.Query(q(`UPDATE KS.accounts SET "balance" = ?, "_exists" = true WHERE "id" = ? IF "_exists" IN (null, true)`),
					int64(1000), id).ScanCASContext(ctx)
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range accounts {
		select {
		case ids <- int64(i):
		case err := <-errs:
			close(ids)
			wg.Wait()
			return err
		}
	}
	close(ids)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// cas runs a conditional write and fails if it did not apply.
func (c *CassRaw) cas(ctx context.Context, stmt string, args ...any) error {
	applied, err := c.session.Query(stmt, args...).ScanCASContext(ctx)
	if err == nil && !applied {
		err = errors.New("the condition did not hold")
	}
	return err
}

func (c *CassRaw) Put(ctx context.Context, key int64, value []byte) error {
	return c.cas(ctx, c.stmts.put, value, key)
}

func (c *CassRaw) CondPut(ctx context.Context, key int64, old, value []byte) error {
	return c.cas(ctx, c.stmts.condPut, value, key, old)
}

func (c *CassRaw) Get(ctx context.Context, key int64) error {
	var k int64
	var v []byte
	var exists bool
	return c.session.Query(c.stmts.get, key).Consistency(gocql.Serial).ScanContext(ctx, &k, &v, &exists)
}

func (c *CassRaw) balance(ctx context.Context, id int64) (int64, error) {
	var b int64
	var exists bool
	err := c.session.Query(c.stmts.read, id).Consistency(gocql.Serial).ScanContext(ctx, &b, &exists)
	return b, err
}

// Transfer is the raw LWT pair (see CassRaw): a failed compare-and-set is
// a conflict, retried with the same backoff as the storage layer's Update
// in the bench (transferPolicy) after reading the balance again.
func (c *CassRaw) Transfer(ctx context.Context, from, to, amount int64) (int, error) {
	retries := 0
	conflict := func() error {
		retries++
		if retries >= transferPolicy.MaxAttempts {
			return errors.New("bench: transfer: too many conflicts")
		}
		return transferPolicy.Sleep(ctx, retries-1)
	}
	for {
		a, err := c.balance(ctx, from)
		if err != nil {
			return retries, err
		}
		b, err := c.balance(ctx, to)
		if err != nil {
			return retries, err
		}
		if a < amount {
			return retries, nil
		}
		applied, _, err := c.setBalance(ctx, from, a, a-amount)
		if err != nil {
			return retries, err
		}
		if !applied {
			if err := conflict(); err != nil {
				return retries, err
			}
			continue
		}
		for {
			applied, cur, err := c.setBalance(ctx, to, b, b+amount)
			if err != nil || applied {
				return retries, err
			}
			if err := conflict(); err != nil {
				return retries, err
			}
			b = cur
		}
	}
}

// setBalance sets account id's balance to to if it is from, and returns
// whether it did and, if not, the balance it found.
func (c *CassRaw) setBalance(ctx context.Context, id, from, to int64) (applied bool, cur int64, err error) {
	var exists bool
	applied, err = c.session.Query(c.stmts.setBalance, to, id, from).ScanCASContext(ctx, &exists, &cur)
	return applied, cur, err
}

func (c *CassRaw) Total(ctx context.Context) (int64, error) {
	// SERIAL reads one partition at a time; QUORUM sees every write that
	// returned, and none is in flight when the bank totals.
	iter := c.session.Query(`SELECT "balance" FROM ` + c.ks + `.accounts`).Consistency(gocql.Quorum).IterContext(ctx)
	var total, b int64
	for iter.Scan(&b) {
		total += b
	}
	return total, iter.Close()
}

func (c *CassRaw) Teardown(ctx context.Context) error {
	if c.session == nil {
		return nil
	}
	defer c.session.Close()
	return c.session.Query(`DROP KEYSPACE IF EXISTS ` + c.ks).ExecContext(ctx)
}
