package transport

import (
	"context"
	"io"
)

// NodeID names a cluster member. 0 is never a node.
type NodeID uint64

// Handler is what a node does with what its peers send. One Handler serves
// one node; the transport calls it from its own goroutines (the gRPC
// implementation) or from inside the in-memory network's Step (memnet).
//
// Implementations must not retain a transport lock across calls and, under
// memnet, must not wait for further network traffic (a Serve that makes a
// blocking Call would wait for a Step that cannot run): handlers there run
// inside Step.
type Handler interface {
	// Receive is called with messages from peer from, a batch at a time,
	// in the order that peer passed them to Send on one Transport — with
	// gaps where messages were lost. Whether messages can also arrive
	// twice or out of order depends on the implementation (see the package
	// doc: grpcnet never does either; memnet does when told to). Receive
	// is never called concurrently for the same peer; it may be for
	// different peers. The handler owns msgs and their bytes: it may keep
	// them. Receive should return quickly: while it runs, the peer's
	// stream waits (gRPC flow control then backs up to the peer's queue).
	Receive(from NodeID, msgs [][]byte)
	// Serve answers a request sent with Call. The reply is the handler's
	// to give: the transport does not modify it. An error is returned to
	// the caller as a *RemoteError carrying its text (not its type). ctx
	// ends when the caller gives up or the transport closes.
	Serve(ctx context.Context, from NodeID, req []byte) ([]byte, error)
	// ReceiveStream consumes a large payload (a snapshot) sent with
	// SendStream, reading it from r until io.EOF, which r returns only
	// once the whole payload has arrived. A sender that fails or gives up
	// makes r return an error instead, never a short payload with io.EOF.
	// The error ReceiveStream returns reaches the sender as a *RemoteError;
	// returning nil before reading everything ends the stream, and the
	// sender's SendStream returns nil. r is valid only until ReceiveStream
	// returns. ctx ends when the sender goes away or the transport closes.
	ReceiveStream(ctx context.Context, from NodeID, r io.Reader) error
}

// Transport sends a node's traffic to its peers. Its methods are safe for
// concurrent use.
type Transport interface {
	// Send queues msgs for peer to and returns at once: it never waits for
	// the network. The messages of one Send are queued all or none. Messages
	// to one peer are batched (several per wire message, up to a byte
	// bound) and sent in the order they were queued by one sender per peer.
	// A full queue (a byte bound, per peer) returns ErrBackpressure and
	// queues nothing: the caller drops the messages (Raft reports the peer
	// unreachable) or retries later. A nil error means queued, not
	// delivered: a queued message can still be lost (see the package doc).
	// The transport may keep msgs until they are sent: the caller must not
	// modify them after the call. Errors: ErrUnknownPeer, ErrTooLarge (a
	// message that can never fit a wire message), ErrBackpressure,
	// ErrClosed.
	Send(to NodeID, msgs ...[]byte) error
	// Call sends req to peer to, waits for the reply of its Handler.Serve
	// and returns it. Errors: ErrUnknownPeer, ErrTooLarge, ErrClosed, a
	// *RemoteError (Serve failed, or the peer refused the call:
	// errors.Is(err, ErrWrongCluster) and the like hold for a refusal),
	// ErrUnreachable (no connection), ErrTimeout (memnet: no reply within
	// its call timeout), or ctx.Err() when ctx ends first. The transport
	// does not modify req.
	Call(ctx context.Context, to NodeID, req []byte) ([]byte, error)
	// SendStream sends everything r yields, until io.EOF, to peer to's
	// Handler.ReceiveStream in chunks of bounded size, and returns once the
	// receiver has returned. It returns nil only if ReceiveStream did.
	// Errors as Call, plus the error of r itself.
	SendStream(ctx context.Context, to NodeID, r io.Reader) error
	// Close stops the transport: every goroutine it started ends, every
	// Call and SendStream in flight returns, and no Handler method is
	// called once Close returns. The gRPC implementation also waits for
	// the Handler calls already running (after cancelling their contexts);
	// memnet cannot, as its handlers run inside Step, often on the very
	// goroutine that calls Close. Messages still queued are dropped. Later
	// calls return ErrClosed; Close is idempotent.
	Close() error
}
