// Package engine is kiroku's embedded, in-memory transactional engine and
// its default storage backend: Silo's optimistic concurrency control with
// SiloR's epoch-based group commit, value logging, fuzzy checkpoints and
// parallel recovery (seed 002). *DB implements storage.Backend and passes
// storage/storagetest.
//
// # Records and index
//
// Each table maps encoded partition keys to partitions in 256 hash shards,
// each an insert-only open-addressing table keyed by the key's 64-bit hash
// and read without locks (table.go says why we wrote our own). A partition
// of a table without clustering key holds its one record inline, in the
// same cache line as its key; otherwise its records sit in a
// github.com/google/btree B-tree ordered by encoded clustering key, under
// the partition's lock; each entry carries the key's first 16 bytes, so a
// search compares words and reads a record only on a tie. Every scan of
// the storage API stays inside one partition, so an ordered index per
// partition is all that is needed, and the hash table in front costs
// fewer cache misses per lookup than an ordered structure over all keys:
// two, the slot and the partition. Writes are not looked up when
// buffered; commit resolves them all at once, so their misses overlap (txn.go, resolve). Keys are encoded to order-preserving
// bytes (key.go). Each record has a TID word (tid.go): lock, latest and
// absent bits, a 40-bit epoch and a 21-bit sequence. Deleted records stay
// in the index, absent, so a transaction that read them still validates
// against their TID.
//
// # Commit (txn.go)
//
// Reads record the TID they saw; reads that find no record record a
// structure version instead: a partition's version (bumped when a record
// is inserted into its tree) or, when the partition itself is missing, the
// version of the partition's bucket among 1024 per table (bumped when a
// partition is created). This is Silo's node-set validation with
// partitions and buckets in place of Masstree nodes. Writes are buffered.
// Commit then: publishes the worker's epoch; inserts absent records for
// new keys (adjusting its own structure versions, as Silo does, and
// validating each inserted record as created, since it is visible before
// it is locked, and a partition it created and had read as missing as
// still empty, since the bucket's version no longer sees inserts into
// it); locks the write set in address order; reads the global epoch; validates the reads
// (TID unchanged, not locked by another) and the structure versions;
// picks the smallest TID above everything read, overwritten and the
// worker's previous TID, inside the epoch; merges partial Puts into the
// current row under the lock; logs; installs and unlocks with the TID
// store. Read-only transactions validate without locks and are released
// once the epoch of the newest version they read is durable, so they never
// expose data that could be lost. Snapshot reads of older versions are not
// implemented: a read-only transaction can abort, and Update retries it.
//
// # Epochs and durability (db.go, log.go)
//
// The advancer moves the global epoch E every EpochInterval, and only when
// no committing worker is in an older epoch, so no worker is more than one
// epoch behind. Workers are commit slots (Workers of them) taken for the
// commit protocol only, so an interactive transaction holds none while
// its client thinks; a raw transaction may pin one for its lifetime, as
// a Silo thread owns its worker (the benchmark's threads do). Each worker appends committed writes to its log
// buffer, through a small stage that stays in cache (worker.log); a buffer
// holds one epoch and goes to the worker's logger when it reaches
// LogBufferSize or the epoch changes. A logger round collects its workers'
// staged entries and buffers of closed epochs and the handed-off ones, appends them
// and a mark "everything of epochs ≤ X is logged" to the LogSink, and once
// the sink says they are durable publishes X, where X = min(E, epochs of
// its committing workers) − 1 read before collecting. The durable epoch D
// is the minimum over loggers; a commit is acknowledged when D reaches its
// epoch. Buffers of the open epoch wait until a batch of them (eight
// buffers) is handed off, so that a round's write and fsync are not paid
// per buffer (logger.writeBatch). A committer that waits on the open
// epoch asks the next idle logger to close it at once, so a lone client
// waits for one log write and fsync rather than an epoch, and under load
// committers pile into the epoch being closed while the previous fsync
// runs (group commit). Before
// an early close the logger lingers (logger.linger): it yields once if
// several committers asked since the last close, and, when at least twice
// as many committers have recently waited at once as wait now and
// goroutines are waiting for a processor (the CPU an fsync costs is then
// scarce), it holds the close until as many wait or a bound passes (three
// times the recent write-and-fsync time, at most Config.CommitDelay). A
// lone committer is not held (at most once, right after a burst of
// others).
//
// Everything that changes the engine's state is a record in one log
// (records.go): buffers, loggers' marks, catalog changes (DDL is logged
// and durable before it takes effect), the decision that epochs are void,
// the start of a leader's era. The loggers and DDL propose to one LogSink
// (the seam for replication: the write-ahead log, package wal, batch
// policy, implements it; a Raft group implements it with "durable"
// meaning committed by a majority, without touching this package's commit
// code). A proposal returns at once and a callback reports when it is
// durable, so a logger may have Config.LogRoundsInFlight rounds in flight.
// One state machine applies the log (apply.go): recovery at Open, and a
// follower as records arrive (DB.Apply). A follower is promoted to lead
// the log it applied (DB.Promote, leader.go); a leader whose sink reports
// another leader stops (LeadershipLostError). Snapshots are checkpoint
// chains in one stream (DB.Snapshot, DB.Install, CheckSnapshot;
// snapshot.go); a follower reopened on a directory that holds a chain
// reloads it (DB.Reinstall). The epoch bookkeeping and the loggers'
// decisions are pure functions a simulation can drive (epochs.go); time
// comes from Config.Clock.
//
// # Checkpoints and recovery (checkpoint.go, recover.go)
//
// Checkpoints run beside writers and are fuzzy, as in SiloR: a checkpoint
// starting at epoch Cs waits until every commit of an earlier epoch is
// installed, copies every live row with its TID, and becomes valid (is
// renamed into place) once D reaches its end epoch Ce. Then the log of
// epochs before Cs is truncated. One starts CheckpointInterval after the
// last one ended, or sooner once CheckpointLogSize bytes were logged since
// the last one began (the log recovery read counts), so the log on disk
// and the replay at Open stay bounded however fast the engine writes or
// however briefly it stays open. A checkpoint is a delta, holding only
// the records written since the one before it began (deletes as
// tombstones), while the deltas since the last full checkpoint weigh less
// than CheckpointDeltaShare of it; then a full one comes. A database that
// keeps every version, as the ledger does, grows without bound, and a
// full checkpoint a minute would rewrite all of it each time. Recovery
// loads the newest full checkpoint and the deltas after it,
// then applies the log with the state machine: buffers of epochs from Cs
// on, held until marks make them durable and then applied in parallel
// keeping the highest TID per key, catalog changes, void ranges and eras
// in log order. It then logs the epochs above the final D that records
// name as void, so those records are never applied, and starts a new era
// above them. The catalog is in the log and in every checkpoint (a
// checkpoint's first chunk), under
// table ids that are never reused. A floor record, logged before each
// truncation, lets recovery refuse a chain that lacks the checkpoint the
// log was truncated for (ErrLogGap). An open engine holds the lock on LOCK
// (lockDir): a second Open of the directory, from this process or
// another, fails with ErrLocked before it reads any of these files.
//
// # Limits and what is not done
//
// A row is at most 64 MiB encoded (and at most what one log record holds);
// a transaction of any size is split over log records. Absent records of
// deleted rows are not yet garbage-collected. The engine does not use
// snapshots for read-only transactions (see above).
package engine
