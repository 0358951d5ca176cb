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
// Tests: a deterministic-network simulation (memnet) of 3 and 5 nodes
// with loss, duplication, reordering, partitions, crashes that keep only
// synced bytes and compaction checks that no term has two leaders, that
// committed entries agree and that no acknowledged write is lost; the
// same simulation over a log that never fsyncs must fail. A register on
// it, written through the leader and read through ReadIndex under the
// same faults, is checked for linearizability with porcupine. A 3-member
// RaftSilo over gRPC on loopback fails over and keeps every
// acknowledged commit, and passes the storage conformance suite.
//
// Not built yet: engine checkpoints as Raft snapshots (the Silo's log is
// never compacted, and a restarted member applies it all), and the
// clustered server.
package replication
