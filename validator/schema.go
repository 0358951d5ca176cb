package validator

import (
	"context"
	"errors"
	"fmt"

	"github.com/kiroku-db/kiroku/storage"
)

// The Validator's tables, in its own namespace (Config.Namespace) of its own
// database:
//
//	clock       (bucket | counter ASC) → value: the K logical-clock
//	            counters, in one partition so that one scan reads them all
//	txs         (nonce) → the request ⟨n, f, a, s⟩ with its identity, the
//	            begin clock and wall time it was logged at; once the reply
//	            (or recovery) arrives: the end clock, the status, the
//	            receipt (read set, write set, result, signature) and the
//	            proofs; and whether validation has covered it
//	unvalidated (bucket | begin ASC, nonce ASC): transactions logged and
//	            not yet validated, in pendingBuckets partitions by nonce.
//	            Ordered by begin clock, logging inserts at the end of a
//	            partition, where the tree's path is in cache; ordered by
//	            nonce, as the table "pending" of earlier versions was
//	            (bucket | nonce ASC → begin), each insert walked a cold
//	            path of a large tree, a fifth of the Validator's logging
//	            CPU. ensureSchema moves an old table's rows here.
//	ends        (bucket | end ASC, nonce ASC) → begin: validated
//	            transactions by end clock, endBucketSpan clocks per
//	            partition, so validation finds the ones that overlap new
//	            work
//	accesses    (id | age ASC, op ASC, nonce ASC): who read ("r") and wrote
//	            ("w") each version, for validated transactions
//	states      (id | age ASC) → output, hash, nonce: the states the
//	            Validator recomputed (its own copy of every version)
//	keys        (bucket | id ASC): every asset id validated, for key ranges
//	violations  (bucket | at ASC, seq ASC) → kind, nonces, keys, JSON
//	meta        (name) → value: the pinned ledger key
const (
	// DefaultNamespace is the Validator's namespace unless Config.Namespace
	// says otherwise.
	DefaultNamespace = "validator"

	tClock      = "clock"
	tTxs        = "txs"
	tPending    = "unvalidated"
	tPendingV1  = "pending" // the layout before unvalidated (migratePending)
	tEnds       = "ends"
	tAccesses   = "accesses"
	tStates     = "states"
	tKeys       = "keys"
	tViolations = "violations"
	tMeta       = "meta"

	clockBucket    = "c"
	keysBucket     = "k"
	violBucket     = "v"
	pendingBuckets = 16
	endBucketSpan  = 1 << 12
)

func tables(ns string) []*storage.Table {
	text := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeText} }
	blob := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeBlob} }
	bigint := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeBigInt} }
	asc := func(n string, t storage.DataType) storage.ClusteringColumn {
		return storage.ClusteringColumn{Name: n, Type: t, Order: storage.Asc}
	}
	return []*storage.Table{
		{Namespace: ns, Name: tClock, PartitionKey: []storage.Column{text("bucket")},
			ClusteringKey: []storage.ClusteringColumn{asc("counter", storage.TypeBigInt)},
			Columns:       []storage.Column{bigint("value")}},
		{Namespace: ns, Name: tTxs, PartitionKey: []storage.Column{text("nonce")},
			Columns: []storage.Column{text("contract"), blob("argument"), text("entity"), bigint("key_version"), blob("signature"),
				bigint("begin_clock"), bigint("logged_at"), bigint("end_clock"), text("status"), text("reason"),
				text("input"), text("writes"), text("result"), blob("receipt_sig"), text("proofs"), bigint("validated")}},
		{Namespace: ns, Name: tPending, PartitionKey: []storage.Column{bigint("bucket")},
			ClusteringKey: []storage.ClusteringColumn{asc("begin_clock", storage.TypeBigInt), asc("nonce", storage.TypeText)}},
		{Namespace: ns, Name: tEnds, PartitionKey: []storage.Column{bigint("bucket")},
			ClusteringKey: []storage.ClusteringColumn{asc("end_clock", storage.TypeBigInt), asc("nonce", storage.TypeText)},
			Columns:       []storage.Column{bigint("begin_clock")}},
		{Namespace: ns, Name: tAccesses, PartitionKey: []storage.Column{text("id")},
			ClusteringKey: []storage.ClusteringColumn{asc("age", storage.TypeBigInt), asc("op", storage.TypeText), asc("nonce", storage.TypeText)},
			Columns:       []storage.Column{bigint("begin_clock"), bigint("end_clock")}},
		{Namespace: ns, Name: tStates, PartitionKey: []storage.Column{text("id")},
			ClusteringKey: []storage.ClusteringColumn{asc("age", storage.TypeBigInt)},
			Columns:       []storage.Column{text("output"), blob("hash"), text("nonce")}},
		{Namespace: ns, Name: tKeys, PartitionKey: []storage.Column{text("bucket")},
			ClusteringKey: []storage.ClusteringColumn{asc("id", storage.TypeText)},
			Columns:       []storage.Column{bigint("seen")}},
		{Namespace: ns, Name: tViolations, PartitionKey: []storage.Column{text("bucket")},
			ClusteringKey: []storage.ClusteringColumn{asc("at", storage.TypeBigInt), asc("seq", storage.TypeBigInt)},
			Columns:       []storage.Column{text("kind"), text("body")}},
		{Namespace: ns, Name: tMeta, PartitionKey: []storage.Column{text("name")},
			Columns: []storage.Column{text("value")}},
	}
}

// ensureSchema creates the namespace and tables that are missing, checks
// that the ones present have the Validator's schema (storage.EnsureTables:
// a database laid out otherwise is refused and left as it was), and moves
// the rows of a table of an earlier layout.
func ensureSchema(ctx context.Context, b storage.Backend, ns string) error {
	if err := storage.EnsureTables(ctx, b, ns, tables(ns)); err != nil {
		return fmt.Errorf("validator: schema of %s: %w", ns, err)
	}
	return migratePending(ctx, b, ns)
}

// migratePending copies every row of the table pending, if there is one,
// to unvalidated, then drops it. The copies are idempotent puts and the
// drop comes last, so a crash part way leaves the old table to be copied
// again at the next start; no pending transaction is lost.
func migratePending(ctx context.Context, b storage.Backend, ns string) error {
	if _, err := b.DescribeTable(ctx, ns, tPendingV1); errors.Is(err, storage.ErrTableNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("validator: table %s.%s: %w", ns, tPendingV1, err)
	}
	for bucket := range int64(pendingBuckets) {
		if err := movePending(ctx, b, ns, bucket); err != nil {
			return fmt.Errorf("validator: moving %s.%s: %w", ns, tPendingV1, err)
		}
	}
	if err := b.DropTable(ctx, ns, tPendingV1); err != nil && !errors.Is(err, storage.ErrTableNotFound) {
		return fmt.Errorf("validator: dropping %s.%s: %w", ns, tPendingV1, err)
	}
	return nil
}

// movePending copies one bucket of the table pending to unvalidated.
func movePending(ctx context.Context, b storage.Backend, ns string, bucket int64) (err error) {
	rows, err := b.Scan(ctx, &storage.Scan{Namespace: ns, Table: tPendingV1, Partition: storage.Values{"bucket": storage.BigInt(bucket)}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rows.Close()) }()
	var ms []storage.Mutation
	flush := func() error {
		if len(ms) == 0 {
			return nil
		}
		err := b.Mutate(ctx, ms)
		ms = ms[:0]
		return err
	}
	for rows.Next() {
		r := rows.Row()
		ms = append(ms, &storage.Put{Namespace: ns, Table: tPending, Partition: storage.Values{"bucket": storage.BigInt(bucket)},
			Clustering: storage.Values{"begin_clock": r["begin_clock"], "nonce": r["nonce"]}})
		if len(ms) == batchSize {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return flush()
}
