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
//	pending     (bucket | nonce ASC) → begin: transactions logged and not
//	            yet validated, in pendingBuckets partitions
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
	tPending    = "pending"
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
			ClusteringKey: []storage.ClusteringColumn{asc("nonce", storage.TypeText)},
			Columns:       []storage.Column{bigint("begin_clock")}},
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

// ensureSchema creates the namespace and tables that are missing.
func ensureSchema(ctx context.Context, b storage.Backend, ns string) error {
	if err := b.CreateNamespace(ctx, ns); err != nil && !errors.Is(err, storage.ErrNamespaceExists) {
		return fmt.Errorf("validator: create namespace %s: %w", ns, err)
	}
	for _, t := range tables(ns) {
		if err := b.CreateTable(ctx, t); err != nil && !errors.Is(err, storage.ErrTableExists) {
			return fmt.Errorf("validator: create table %s.%s: %w", ns, t.Name, err)
		}
	}
	return nil
}
