// Package ledger is kiroku's ledger (seed 000): deterministic contracts run
// as one-shot, strictly serializable transactions on the storage API; every
// asset is an append-only chain of hash-linked versions; every write comes
// back with a proof the ledger signs, so that a second organisation can
// check later what the ledger did.
//
// # One execution
//
// Execute checks the request ⟨nonce, contract id, argument, entity + key
// version, signature⟩ (field rules, then the signature against the
// registered HMAC secret or ECDSA certificate), then runs the contract
// inside storage.UpdateWith: the transaction runs the contract — get, put,
// scan and nested call through a Context — and, if it succeeds, appends
// one version per written asset (age = head + 1, prev_hash = the head's
// hash, hash over the encoding of FORMAT.md), updates the heads, and
// records the nonce as committed with the result and the ages written. A
// nonce is accepted once: its state is recorded on condition that it has
// none yet, so the transaction of a reused nonce writes nothing and the
// request fails with ErrNonceReused. A conflict re-runs the
// whole thing; the contract is deterministic, so that is safe. A signed
// request that fails records the nonce as aborted with its error kind and
// reason and writes no asset; a request that fails authentication writes
// nothing at all.
//
// # Records and errors
//
// The records the ledger exchanges with its clients — Request,
// ContractRegistration, Version, Proof, Receipt, Result, TxState — their
// encodings, Sign and Verify, and the sentinel errors with their kinds
// are package proof's, so that the SDK, the Validator and the Auditor can
// build and check them without linking the interpreter or storage. This
// package names them by alias (ledger.Request is proof.Request), and its
// errors are proof's values, so errors.Is matches either.
//
// # Determinism
//
// Contracts cannot reach the clock, randomness or any I/O: Starlark has no
// such built-ins and the ledger adds none, load() is not provided and
// print() does nothing; dict and set iteration follow insertion order, and
// values cross between JSON and Starlark in one canonical form (RFC 8785,
// object members in sorted order). A contract's only inputs are its
// argument and what it reads, and the versions it read are recorded in
// every proof's input set. Re-executing a contract on the same argument and
// the same input versions therefore gives byte-identical outputs;
// TestDeterministicReexecution checks it on two independent ledgers, and
// ValidateLedger relies on it. Built-in Go contracts (Builtins) follow the
// same rule by review.
//
// # Bounds
//
// Limits bounds the Starlark steps of a request (nested calls included),
// the size of values, results, arguments and sources, the depth of nested
// calls (a contract that calls itself is refused at once), scans, the
// bytes a request reads through get and scan, and the assets one
// transaction writes.
//
// It also bounds the memory a request's Starlark allocates
// (MaxMemoryBytes, ErrMemoryLimit). The interpreter counts steps but not
// bytes, and one step can ask for gigabytes ('x' * 500000000, or str() of
// a list holding a thousand references to one long string), so every
// contract is rewritten when it compiles: each operation that can make a
// value grow by more than a constant per step — repetition,
// concatenation, % and format, str, repr, list and the other conversions,
// the string, list, dict and set methods that build new values, slices,
// *args — first has its result's size estimated and charged, and is
// refused before it allocates if the request's total would pass the
// budget (guard.go, memory.go). Values read, put, passed to a nested call
// and returned count too. The count is cumulative and nested calls share
// it; what the guards do not see is bounded per step, so a request's
// Starlark holds at most its budget plus a constant per step. Integers
// are capped at 2^20 bits, so that no single arithmetic step runs for
// long. The rewrite keeps each program's meaning and its step count.
//
// Hashing and comparing is measured too, since one step can do a lot of
// it without allocating: a tuple that shares its parts is exponentially
// large expanded, and keys whose hashes collide (integers 2^32 apart,
// tuples built for it) make every lookup compare the key with all of
// them. Work beyond a small allowance per operation is charged as steps,
// and an operation that would do more than a bound — per operation, per
// lookup — fails with ErrStepLimit before it does (memory.go).
//
// A request's Starlark stops at MaxExecutionTime (ErrTimeLimit), however
// long its client would wait; the interpreter checks between steps, so a
// single step ends first. Every guarded step is bounded, by the memory
// budget and the work measure, and the operations that look up or store
// many keys (set(), dict(), update, union, |, ==, ...) check between
// keys. What a single step can still take long on is a table that grows:
// it re-inserts every key, and for keys that collide that costs about
// what storing them one by one did before. A request's Starlark also
// stops when its request's context ends (a deadline, a cancel); that
// failure is not the request's, so no abort is recorded and its nonce
// stays free.
//
// Server-wide, at most MaxConcurrentExecutions requests run Starlark at
// once, and their budgets add up to at most MaxTotalMemoryBytes: each
// reserves its MaxMemoryBytes while its Starlark runs (not while its
// transaction commits). A request that finds no room within
// MaxExecutionTime fails with ErrOverloaded; nothing is recorded, so it
// can be sent again as it is. Built-in Go contracts are reviewed code and
// take no part in these three bounds.
//
// # Storage
//
// Everything lives in the storage API (schema.go), so the ledger runs
// unchanged on the embedded engine and on PostgreSQL: asset versions
// (partition id, clustering age), heads, contracts, identities (secrets
// sealed under the server key) and transaction states.
package ledger
