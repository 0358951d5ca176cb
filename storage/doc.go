// Package storage is kiroku's data model and the interface every storage
// backend implements: the multi-dimensional map of Apollo Storage (seed 003),
// the model ScalarDB exposes.
//
// # Data model
//
// Namespaces hold tables. A table (Table) has one or more partition-key
// columns, zero or more clustering-key columns each ASC or DESC, and value
// columns. A row is addressed by its partition key, which says which rows
// live together, and its clustering key, which orders rows inside the
// partition. Types are BOOLEAN, BIGINT, DOUBLE, TEXT, BLOB and TIMESTAMP;
// value columns may be NULL, key columns may not, and DOUBLE cannot be a key.
//
// Values (Value) have one order everywhere — in scans, conditions and on
// every backend: false < true; BIGINT and TIMESTAMP numerically; DOUBLE
// numerically with -Inf < finite < +Inf < NaN, NaN = NaN and -0 = +0; TEXT
// and BLOB by bytes (Unicode code point order for TEXT). TEXT is valid UTF-8
// without NUL; arbitrary bytes belong in a BLOB. TIMESTAMP is an instant with
// microsecond precision in years 0001–9999 UTC. An empty TEXT or BLOB is not
// NULL.
//
// # Operations
//
// Ops are the single-partition operations of Apollo Storage: Get a row by
// its full key; Scan one partition between optional bounds on a prefix of
// the clustering key, in clustering order or its reverse, with a limit;
// Put (an upsert of the named value columns); Delete; and Mutate, several
// puts and deletes on one partition applied atomically. Puts and deletes take
// a condition — IfExists, IfNotExists (Put only), or If with expressions
// AND-joined (=, <>, <, <=, >, >=, IS NULL, IS NOT NULL) that also requires
// the row to exist — evaluated atomically with the write. A comparison with a
// NULL column is false, as in SQL. A condition that does not hold returns
// ErrConditionNotMet and writes nothing. In a transaction, a conditional
// Put may be Deferred: its failure may then come from a later call or
// Commit, and ends the transaction (a backend that queues writes sends it
// without a round trip of its own). A Skippable put's condition that does
// not hold skips it instead, silently, in a transaction or not; a backend
// that queues writes sends it without a round trip of its own too. A
// transaction may also Expect a row to meet a condition without writing
// it: it then commits only if the row does, and the failure, like a
// Deferred put's, may come from a later call.
//
// Transactions (Txn, and the Update helper that retries conflicts) are
// strictly serializable, phantoms included: a transaction that scanned a
// range conflicts with one that inserted into it. They are a capability:
// a Store (schemas and the single operations) is what every database has
// natively and what a backend must provide; a Backend is a Store with
// transactions, native (the embedded engine, PostgreSQL) or built over a
// Store that has none by storage/coordinator (Cassandra).
//
// # Bad input
//
// Every request is checked against the table's schema and the Limits before
// anything is sent to the backend. Bad input — an unknown namespace, table or
// column; a missing or extra key column; a NULL key; a value of the wrong
// type; invalid TEXT or an out-of-range TIMESTAMP; a scan bound that is not a
// prefix of the clustering key; a value or key over the limits; an invalid
// name — gets an *Error whose Kind is the matching sentinel (errors.Is(err,
// storage.ErrTypeMismatch)), and nothing is written.
//
// Backends only read a request (a Get, Put, Scan and their maps), and keep
// no reference to it once the call returns, except that a Scan's Rows may
// read its Projection until they are closed; a returned Row shares no map
// with the request. A caller may build a request once and reuse it, also
// from concurrent goroutines, or refill the same request and maps for each
// call.
//
// # Limits
//
//   - Names of namespaces, tables and columns: 1–48 bytes of [a-z0-9_],
//     starting with a letter. Namespaces "public", "information_schema" and
//     any starting with "pg_" or "kiroku" are reserved.
//   - At most 128 columns per table, at most 16 of them key columns.
//   - A row's key (partition plus clustering values, by Value.Size) is at
//     most Limits.MaxKeySize bytes: 1 KiB by default, 2 KiB at most, because
//     a PostgreSQL B-tree entry cannot hold much more.
//   - One value is at most Limits.MaxValueSize bytes: 4 MiB by default,
//     256 MiB at most. Large evidence files belong in the geo blob layer,
//     with only their hash in a table.
//   - One Put (its key and the values it sets) is at most
//     Limits.MaxWriteSize bytes: 16 MiB by default, 512 MiB at most.
//
// # Backends
//
// Backends live in sub-packages (postgres, cassandra; the embedded engine
// in engine) and must pass the conformance suite in storagetest:
// its store part (storagetest.RunStore) for every Store, the whole of it
// (storagetest.Run) for every Backend.
package storage
