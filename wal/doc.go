// Package wal is kiroku's write-ahead log: a segmented, append-only log of
// records addressed by consecutive indexes, with four sync policies, crash
// recovery that tells a torn tail from corruption, and prefix and suffix
// truncation. The embedded engine writes its epoch log buffers to it; Raft
// replication will keep its log in it. FORMAT.md beside this file gives the
// byte format.
//
// # Sync policies (seeds 003 and 001)
//
//   - Batch: every append waits for an fsync; the syncer starts one as soon
//     as anything is pending, so what queues up during an fsync shares the
//     next one.
//   - Group(window): appends wait; the syncer runs once per window, on a
//     fixed cadence, covering everything written before the round began.
//     Seed 003 reports about 1.5× more records per fsync than batch and
//     lower latency near saturation; docs/benchmarks.md has kiroku's figures.
//   - Count(N, maxWait): the syncer runs once N records are pending or the
//     oldest has waited maxWait (seed 001, Algorithm 1).
//   - Periodic(interval): an append is acknowledged once written to the
//     operating system and the syncer fsyncs every interval. ACKNOWLEDGED
//     RECORDS CAN BE LOST ON A POWER FAILURE (or kernel crash): everything
//     since the last fsync. This is Cassandra's default; never use it for
//     data that must not be lost.
//
// # Appending without waiting
//
// Append and AppendBatch wait for their records to be acknowledged.
// AppendAsync returns the first index at once and calls a callback when
// they are, so a caller (Raft's log, the engine's pipelined log sink) keeps
// many batches in flight, and one fsync covers every batch written before
// it began. All three go through one path: a batch is encoded into the
// pending chunks and registered on the current round; when the syncer ends
// the round it closes the round's channel, which the waiting appenders
// block on, and then calls the round's callbacks in append order.
//
// # Time
//
// The log reads the time and waits only through Config.Clock, so a
// deterministic simulation drives it with a fake clock. The decision of
// when to write and fsync is a pure function of what the syncer knows,
// the time included (decide, policy.go); the syncer reads the clock, calls
// it, and waits on a timer of the clock. With the real clock, the last
// stretch of a short wait is slept precisely instead (sleep_linux.go).
//
// # Invariants
//
//   - Never acknowledge early. Under every policy but Periodic, Append
//     returns, and AppendAsync's callback runs, only after an fdatasync
//     that began after the records were written has returned. Appenders
//     take the current round under the log's mutex; the syncer swaps in a
//     new round under the same mutex when it takes the pending records, so
//     a waiter or callback is always registered on the round that covers
//     it before the syncer reads its target.
//   - Acknowledgements in order. Rounds end one at a time, in the order
//     they were taken, and a round's callbacks run in the order their
//     batches were appended, all from the syncer goroutine; on a failure,
//     the round in flight's callbacks run before those of the round behind
//     it.
//   - An fsync error is fatal. The log enters a failed state: the round in
//     flight, every waiter and every later call get ErrFailed wrapping the
//     error, callbacks included. Nothing is retried: after a failed fsync the
//     kernel may have dropped the dirty pages, so a later success would
//     prove nothing.
//   - Every segment but the last is whole on disk: the old segment is
//     fsynced before the first byte goes to the next, and a segment is
//     zero-filled, synced and durably named before it holds a record. A
//     segment TruncateFront removed may be kept and overwritten with zeros
//     for this (Config.RecycleSegments), which spares fresh page-cache
//     pages and block allocation. Once the old segment is synced, the
//     preparer drops its pages from the page cache (clean pages: the disk
//     is untouched), so the next zero-fill reuses them.
//   - Writes cover whole 4 KiB blocks. A round's write starts at the
//     block boundary before the first new frame, repeating the bytes the
//     segment already holds there, and is padded with zeros to the next
//     boundary, where the segment holds zeros anyway. The bytes on disk
//     are those of unaligned writes; only the I/O differs. So segments
//     can be written with direct I/O (the default; Config.BufferedIO): a
//     write goes from the log's buffer to the device, with no copy into
//     the page cache, and fdatasync flushes the device's cache. A write
//     that repeats a block's durable start risks what the kernel's own
//     writeback of a partly written page risks, and no more.
//   - Bounded: at most Config.MaxPending bytes wait to be written; Append
//     blocks (honouring its context) beyond that, and so does AppendAsync.
//     However many batches are in flight, their bytes count against it
//     until they are written.
//   - Two goroutines, the syncer and the segment preparer, both owned by the
//     Log and stopped by Close, which first writes and fsyncs whatever is
//     pending, under every policy, and answers every waiter and callback.
//
// # Files
//
// All file I/O goes through a pebble vfs.FS, so tests run on the crashable
// in-memory filesystem (which keeps only synced bytes, plus a chosen share of
// unsynced 4 KiB blocks, at a simulated crash) and on errorfs, which injects
// I/O errors. DelaySyncFS adds latency to every fsync, to emulate a slow
// device in benchmarks. The decision of when to sync is a pure function
// (policy.go), separate from the goroutine that carries it out.
package wal
