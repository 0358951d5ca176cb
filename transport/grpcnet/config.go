package grpcnet

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/transport"
)

// Config configures a Transport. Sizes are in bytes, times are durations;
// a zero field takes the default its comment gives.
type Config struct {
	// NodeID is this node's id. Required (not 0).
	NodeID transport.NodeID
	// ClusterID names the cluster. Traffic carries it, and traffic of
	// another cluster is refused (ErrWrongCluster). Required: 1 to 128
	// printable ASCII characters (it travels as gRPC metadata).
	ClusterID string
	// Peers maps each other member's node id to its gRPC target address
	// ("host:port"). It may list NodeID too (one map for the whole
	// cluster); that address is not used. Traffic from a node not in
	// Peers is refused (ErrUnknownPeer). Transport.AddPeer adds one later
	// (a member added to the cluster).
	Peers map[transport.NodeID]string
	// QueueBytes bounds, per peer, the bytes of messages queued by Send
	// and not yet taken by the peer's sender; Send returns ErrBackpressure
	// beyond it. 0 means 16 MiB; at least BatchBytes.
	QueueBytes int
	// BatchBytes bounds one wire message of the Messages stream, encoded:
	// the sender packs queued messages into a batch up to it. One message,
	// and one Call request or reply, must fit in a batch alone, or is
	// refused with ErrTooLarge. It must not exceed what the receiving
	// gRPC server accepts (grpc.MaxRecvMsgSize: 4 MiB by default, kiroku's
	// server Transport.MaxRequestBytes, 2 MiB by default). 0 means 1 MiB.
	BatchBytes int
	// ChunkBytes bounds one chunk of SendStream; the receiver refuses a
	// larger one with ErrTooLarge. Same server limit as BatchBytes. 0
	// means 256 KiB.
	ChunkBytes int
	// DialTimeout is the least time one connection attempt is given (gRPC's
	// MinConnectTimeout). 0 means 5 s.
	DialTimeout time.Duration
	// BackoffBase and BackoffMax bound the wait before a new stream after
	// one broke or could not be opened: the n-th failure in a row waits
	// BackoffBase·2^(n-1), at most BackoffMax, times a jitter factor drawn
	// from [1-BackoffJitter, 1+BackoffJitter]. They also set gRPC's own
	// reconnection backoff. 0 means 100 ms and 5 s; BackoffMax is raised
	// to BackoffBase.
	BackoffBase, BackoffMax time.Duration
	// BackoffJitter is the jitter fraction, in (0, 1). 0 means 0.2.
	BackoffJitter float64
	// KeepaliveTime is how long a connection is idle before the client
	// pings it to check the peer is there, and KeepaliveTimeout how long
	// it waits for the answer before it closes the connection (breaking
	// its streams). The peer's server must allow pings this often
	// (keepalive.EnforcementPolicy.MinTime ≤ KeepaliveTime: kiroku's
	// server permits 10 s; gRPC's default is 5 minutes). 0 means 30 s and
	// 10 s; a negative KeepaliveTime sends no pings.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// DialOptions are added to the transport's own when it connects to a
	// peer, after them, so they win: credentials (the default is an
	// insecure connection), interceptors, a custom dialer.
	DialOptions []grpc.DialOption
	// Clock times the backoff waits. nil means the real clock.
	Clock clockwork.Clock
	// OnUnreachable, if set, is called by a peer's sender each time a
	// stream to it breaks or cannot be opened, with the cause (a
	// *RemoteError for a refusal, which errors.Is matches to
	// ErrWrongCluster and the like; otherwise ErrUnreachable) and the
	// number of queued messages that were dropped. Raft's ReportUnreachable
	// belongs here. It runs on the sender's goroutine: it must not block.
	OnUnreachable func(peer transport.NodeID, dropped int, err error)
	// Logger logs connection events; nil discards them.
	Logger *slog.Logger
}

// Validate rejects a bad configuration and fills defaults.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: grpcnet: "+format, append([]any{transport.ErrConfig}, args...)...)
	}
	if c.NodeID == 0 {
		return bad("NodeID is 0")
	}
	if len(c.ClusterID) == 0 || len(c.ClusterID) > 128 {
		return bad("ClusterID must have 1 to 128 characters")
	}
	for i := 0; i < len(c.ClusterID); i++ {
		if b := c.ClusterID[i]; b < 0x20 || b > 0x7e {
			return bad("ClusterID %q is not printable ASCII", c.ClusterID)
		}
	}
	for id, addr := range c.Peers {
		if id == 0 {
			return bad("Peers has node id 0")
		}
		if addr == "" && id != c.NodeID {
			return bad("peer %d has no address", id)
		}
	}
	if c.QueueBytes < 0 || c.BatchBytes < 0 || c.ChunkBytes < 0 || c.DialTimeout < 0 ||
		c.BackoffBase < 0 || c.BackoffMax < 0 || c.KeepaliveTimeout < 0 {
		return bad("negative size or duration")
	}
	if !(c.BackoffJitter >= 0 && c.BackoffJitter < 1) {
		return bad("BackoffJitter %v not in [0, 1)", c.BackoffJitter)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BatchBytes, 1<<20)
	def(&c.QueueBytes, 16<<20)
	def(&c.ChunkBytes, 256<<10)
	if c.BatchBytes < minBatchBytes {
		return bad("BatchBytes %d below %d", c.BatchBytes, minBatchBytes)
	}
	if c.QueueBytes < c.BatchBytes {
		return bad("QueueBytes %d below BatchBytes %d", c.QueueBytes, c.BatchBytes)
	}
	defDur(&c.DialTimeout, 5*time.Second)
	defDur(&c.BackoffBase, 100*time.Millisecond)
	defDur(&c.BackoffMax, 5*time.Second)
	c.BackoffMax = max(c.BackoffMax, c.BackoffBase)
	if c.BackoffJitter == 0 {
		c.BackoffJitter = 0.2
	}
	defDur(&c.KeepaliveTime, 30*time.Second)
	defDur(&c.KeepaliveTimeout, 10*time.Second)
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// minBatchBytes is the least BatchBytes: room for a small message.
const minBatchBytes = 64
