// Package replication replicates kiroku's state through one Raft group
// (go.etcd.io/raft/v3), and the embedded engine's log through it (seed
// 002, RaftSilo).
//
// A Node is raft.RawNode with AsyncStorageWrites, driven by one goroutine
// (Runner's, or a simulation's). Its log is a wal.Log in Dir/raft: every
// MsgStorageAppend — entries, hard state, snapshot — is appended without
// waiting, and the responses that promise durability (the node's own
// MsgStorageAppendResp, MsgAppResp to the leader, votes) are released
// only after the fsync that covers it. Under wal.CountPolicy(N, maxWait)
// many appends share one fsync: seed 001's follower bulk fsync (its
// Algorithm 1), with durability kept; the leader persists its own entries
// the same way. Messages go out on a transport.Transport as soon as they
// are ready. A panic of the Raft library (its log contradicts what its
// peers know) stops the node with ErrCorruptLog instead of the process.
//
// The log's records (storage.go): entries, hard states, installed
// snapshots and compactions, each a WAL record; replay at Open rebuilds
// raft.MemoryStorage. Compaction appends a compact record and the hard
// state, then truncates the WAL before the first entry kept; a snapshot
// installed is restored once its record is durable, and the WAL before
// it is truncated.
//
// A Silo is a member of a replicated engine: each engine log record is
// one entry. A follower's engine (engine.Config.Follow) applies committed
// entries as they come (hot standby). A node that leads, once it applied
// everything committed before its term (its first entry of the term is
// applied), promotes its engine (engine.DB.Promote), which voids the
// epochs that can no longer be completed and starts its era; its
// loggers' records are then proposed, and an epoch is durable once every
// record of it is committed, so commits are acknowledged only when a
// majority holds them. A leader that loses office fails its pending
// proposals (engine.LeadershipLostError) and is reopened as a follower.
//
// Snapshots (snapshot.go, FORMAT.md): the leading engine's checkpoints
// compact the Raft log (the engine's TruncateFront), and the Raft
// snapshot's data names the engine's checkpoint chain. A follower behind
// the compacted log is streamed the engine's snapshot (engine.DB.Snapshot)
// through the transport's SendStream, with the MsgSnap at its head and a
// SHA-256 in it; the follower checks it as it keeps it, refuses a damaged
// one (SnapshotError, an ErrBadSnapshot) before Raft sees it, and
// installs it into a fresh engine (engine.DB.Install) once Raft's record
// of it is durable. A restarted member reloads its snapshot — its own
// checkpoints (engine.DB.Reinstall) or the stream it kept — and applies
// the log after it. Followers' engines write no checkpoints, so a
// follower keeps its log back to its last snapshot.
//
// Tests: a deterministic-network simulation (memnet) of 3 and 5 nodes
// with loss, duplication, reordering, partitions, crashes that keep only
// synced bytes and compaction checks that no term has two leaders, that
// committed entries agree and that no acknowledged write is lost; the
// same simulation over a log that never fsyncs must fail. A register on
// it, written through the leader and read through ReadIndex under the
// same faults, is checked for linearizability with porcupine. A 3-member
// RaftSilo over gRPC on loopback fails over and keeps every
// acknowledged commit, and passes the storage conformance suite; a
// member stopped while the leader compacts past its log catches up from
// a snapshot (after refusing damaged ones, its engine untouched), comes
// back from it when restarted, and leads with every row.
//
// Not built yet: followers' own checkpoints (a follower's log grows
// until it installs a snapshot or leads), and the clustered server.
package replication
