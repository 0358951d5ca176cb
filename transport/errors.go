package transport

import (
	"errors"
	"fmt"
)

// The transport's errors. Every error the package and its implementations
// return is, or wraps, one of these (errors.Is), or is the caller's own
// context's error, or the error of the caller's reader.
var (
	// ErrBackpressure: Send found the peer's queue too full to take the
	// messages; nothing was queued.
	ErrBackpressure = errors.New("transport: peer queue full")
	// ErrUnknownPeer: the node id is not a peer of this node (Send, Call,
	// SendStream), or a remote node refused us because our id is not a
	// peer of its own.
	ErrUnknownPeer = errors.New("transport: unknown peer")
	// ErrWrongCluster: traffic from a node of another cluster, refused.
	ErrWrongCluster = errors.New("transport: wrong cluster")
	// ErrWrongNode: traffic addressed to another node id than the one that
	// received it (a peer address map that points at the wrong node).
	ErrWrongNode = errors.New("transport: addressed to another node")
	// ErrTooLarge: a message, request, reply or chunk over the configured
	// bound.
	ErrTooLarge = errors.New("transport: too large")
	// ErrClosed: the transport (or the peer's) is closed.
	ErrClosed = errors.New("transport: closed")
	// ErrUnreachable: no connection to the peer could be used.
	ErrUnreachable = errors.New("transport: peer unreachable")
	// ErrTimeout: no reply came within the in-memory network's call
	// timeout (a lost request or reply). Real deadlines are the caller's
	// context's, and end a call with ctx.Err().
	ErrTimeout = errors.New("transport: timed out")
	// ErrRemote: the peer's handler failed; the error is a *RemoteError.
	ErrRemote = errors.New("transport: remote handler failed")
	// ErrConfig: a configuration that Validate rejects.
	ErrConfig = errors.New("transport: invalid config")
)

// RemoteError is the error a peer returned: its Handler's error (Serve,
// ReceiveStream), whose text alone crosses the network, or a refusal of
// the call by the peer's transport, in which case Refusal is the sentinel
// (ErrWrongCluster, ErrUnknownPeer, ErrWrongNode, ErrTooLarge, ErrClosed).
type RemoteError struct {
	Peer    NodeID
	Msg     string
	Refusal error // nil for a Handler's error
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("transport: peer %d: %s", e.Peer, e.Msg)
}

// Is reports ErrRemote for a Handler's error and the refusal's sentinel
// for a refusal.
func (e *RemoteError) Is(target error) bool {
	if e.Refusal != nil {
		return target == e.Refusal
	}
	return target == ErrRemote
}
