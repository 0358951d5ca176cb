package replication

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/wal"
)

// Config configures a node. Zero fields take the defaults named.
type Config struct {
	// ID is this node's id in the cluster; 0 is not an id. Required.
	ID uint64
	// ClusterID names the cluster. A node's directory records it, with
	// the node's id and its initial peers, on first use, and refuses to
	// open for another (ErrWrongCluster, ErrPeersMismatch). "" means
	// "kiroku".
	ClusterID string
	// Peers are the ids of the cluster's first voters, this node among
	// them. A node whose log is empty starts a cluster of them; a node
	// with a log ignores Peers and follows its log's configuration. A
	// node that joins an existing cluster starts with no Peers and waits
	// to be added.
	Peers []uint64
	// Dir holds the node's Raft log (Dir/raft). Required.
	Dir string
	// FS is the filesystem; nil means the operating system's.
	FS vfs.FS
	// Clock drives the ticks and the log's sync waits; nil means the real
	// clock.
	Clock clockwork.Clock
	// TickInterval is the time of one Raft tick. 0 means 100 ms.
	TickInterval time.Duration
	// ElectionTicks and HeartbeatTicks are raft.Config's ElectionTick and
	// HeartbeatTick. 0 means 10 and 1: a leader is suspected after 1 s
	// to 2 s without a heartbeat, with the default tick.
	ElectionTicks, HeartbeatTicks int
	// PreVote and CheckQuorum are raft.Config's: a partitioned node does
	// not disrupt the cluster when it comes back, and a leader cut off
	// from a quorum steps down. kiroku's server turns both on.
	PreVote, CheckQuorum bool
	// MaxSizePerMsg bounds an append message's entries, in bytes. 0 means
	// 1 MiB.
	MaxSizePerMsg uint64
	// MaxInflightMsgs bounds the append messages in flight to one
	// follower. 0 means 256.
	MaxInflightMsgs int
	// MaxUncommittedEntriesSize bounds the leader's uncommitted entries,
	// in bytes: a proposal past it is dropped (ErrProposalDropped). 0
	// means 64 MiB.
	MaxUncommittedEntriesSize uint64
	// Sync is the Raft log's fsync policy (package wal). A follower's
	// appends and the leader's own are made durable together under it:
	// wal.CountPolicy(N, maxWait) is seed 001's follower bulk fsync, one
	// fsync per N entries or maxWait; wal.GroupPolicy(window) one per
	// window. Responses that promise durability (MsgAppResp, votes) are
	// released only after the fsync. The zero value is wal.BatchPolicy:
	// one fsync for whatever is pending when the last one ends.
	Sync wal.Policy
	// SerialAppends makes every append durable before the node goes on,
	// one fsync per Ready, as a Raft driver without asynchronous storage
	// writes does: the baseline that follower bulk fsync is measured
	// against (kiroku bench raft). Sync is then ignored.
	SerialAppends bool
	// SyncEachEntry, with SerialAppends, makes each entry durable on its
	// own, one fsync per entry: the baseline seed 001 measures against.
	SyncEachEntry bool
	// SegmentSize is the Raft log's segment size. 0 means 64 MiB.
	SegmentSize int64
	// Logf reports elections and failures; nil discards.
	Logf func(format string, args ...any)
}

// ErrConfig is the cause of a Config that cannot work.
var ErrConfig = errors.New("replication: bad config")

func (c *Config) validate() error {
	if c.ID == 0 {
		return fmt.Errorf("%w: ID 0", ErrConfig)
	}
	if c.Dir == "" {
		return fmt.Errorf("%w: Dir is empty", ErrConfig)
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.ClusterID == "" {
		c.ClusterID = "kiroku"
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = 1 << 20
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = 256
	}
	if c.MaxUncommittedEntriesSize == 0 {
		c.MaxUncommittedEntriesSize = 64 << 20
	}
	if c.SyncEachEntry && !c.SerialAppends {
		return fmt.Errorf("%w: SyncEachEntry needs SerialAppends", ErrConfig)
	}
	if c.Sync == (wal.Policy{}) || c.SerialAppends {
		c.Sync = wal.BatchPolicy()
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 64 << 20
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	seen := map[uint64]bool{}
	for _, p := range c.Peers {
		if p == 0 || seen[p] {
			return fmt.Errorf("%w: peer %d given twice or 0", ErrConfig, p)
		}
		seen[p] = true
	}
	switch {
	case len(c.Peers) > 0 && !seen[c.ID]:
		return fmt.Errorf("%w: node %d is not among its peers %v", ErrConfig, c.ID, c.Peers)
	case c.TickInterval < time.Millisecond || c.TickInterval > time.Minute:
		return fmt.Errorf("%w: TickInterval %v outside 1ms..1m", ErrConfig, c.TickInterval)
	case c.HeartbeatTicks < 1 || c.ElectionTicks <= c.HeartbeatTicks || c.ElectionTicks > 1000:
		return fmt.Errorf("%w: ElectionTicks %d must exceed HeartbeatTicks %d (at least 1), at most 1000", ErrConfig, c.ElectionTicks, c.HeartbeatTicks)
	case c.MaxSizePerMsg < 1<<10 || c.MaxSizePerMsg > 64<<20:
		return fmt.Errorf("%w: MaxSizePerMsg %d outside 1 KiB..64 MiB", ErrConfig, c.MaxSizePerMsg)
	case c.MaxInflightMsgs < 1 || c.MaxInflightMsgs > 1<<16:
		return fmt.Errorf("%w: MaxInflightMsgs %d outside 1..65536", ErrConfig, c.MaxInflightMsgs)
	case c.MaxUncommittedEntriesSize < c.MaxSizePerMsg:
		return fmt.Errorf("%w: MaxUncommittedEntriesSize %d below MaxSizePerMsg", ErrConfig, c.MaxUncommittedEntriesSize)
	case c.SegmentSize < 1<<20:
		return fmt.Errorf("%w: SegmentSize %d below 1 MiB", ErrConfig, c.SegmentSize)
	}
	return nil
}
