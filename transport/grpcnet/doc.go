// Package grpcnet implements transport.Transport over gRPC, as the
// kiroku.transport.v1.Peer service (api/transport.proto).
//
// A node makes one Transport (New), registers its service on the gRPC
// server it already runs (Register; the transport starts no server) and
// dials each peer of Config.Peers through one gRPC client connection:
//
//   - Send: per peer, a queue bounded in bytes (Config.QueueBytes) and one
//     sender goroutine that opens a long-lived Messages stream at the first
//     Send to the peer, keeps it up from then on, and writes the queue on it
//     in batches of at most Config.BatchBytes, in order. The server accepts a stream by sending
//     its headers before reading, so a refusal is known before any batch is
//     sent. When the stream breaks (or cannot be opened), the sender drops
//     the batch in flight and everything queued, reports it to
//     Config.OnUnreachable, and waits BackoffBase·2^(n-1) after the n-th
//     failure in a row (at most BackoffMax, with jitter) before the next
//     stream. A watcher goroutine per stream
//     notices a stream the peer ends while the sender has nothing to send.
//   - Call: a unary RPC; SendStream: a client stream of chunks of at most
//     Config.ChunkBytes, whose reply comes once the receiver's
//     ReceiveStream has returned.
//   - Every RPC carries the cluster id and the sender's and receiver's node
//     ids as metadata; a refusal is a status with a google.rpc.ErrorInfo
//     detail (domain "transport.kiroku") whose reason names it, turned back
//     into a *transport.RemoteError that errors.Is matches to
//     ErrWrongCluster, ErrUnknownPeer, ErrWrongNode, ErrTooLarge or
//     ErrClosed. A Handler's error travels as its text (ErrRemote).
//
// The gRPC server's options bound what it accepts: its MaxRecvMsgSize must
// exceed BatchBytes and ChunkBytes, and its keepalive enforcement must
// allow Config.KeepaliveTime. See package transport for the guarantees.
package grpcnet
