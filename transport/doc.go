// Package transport is kiroku's node-to-node messaging: what Raft
// replication sends between the members of a group, and what the geo layer
// will send between datacenters. It owns the contract (Handler, Transport,
// the errors in errors.go) and two implementations:
//
//   - transport/memnet: a deterministic, fault-injecting in-memory network
//     for tests and the simulator. Nothing moves unless the caller steps it.
//   - transport/grpcnet: gRPC streams between real nodes, registered as the
//     kiroku.transport.v1.Peer service (api/transport.proto) on the node's
//     existing gRPC server.
//
// transport/transporttest is the conformance suite both pass.
//
// # Three kinds of traffic
//
//   - Send: one-way messages (Raft's), queued per peer with a byte bound,
//     batched, sent in order by one sender per peer. Send never waits: a
//     full queue is ErrBackpressure, and the caller drops or retries.
//   - Call: one request, one reply (the geo layer's lookups and reads).
//   - SendStream: one large payload (a Raft snapshot, an erasure-coded
//     chunk) in chunks of bounded size, read by the receiver as an
//     io.Reader; the receiver's verdict comes back to the sender.
//
// # What each implementation guarantees
//
// Per ordered pair of nodes (sender, receiver) and one sender Transport:
//
//	                         memnet (no faults)  memnet (faults)   grpcnet
//	Send: loss               none                Drop, cuts, down  on a broken stream
//	Send: duplication        none                Duplicate         never
//	Send: reordering         none                Reorder, dups     never
//	Call/stream: loss        none                as Send →         a broken connection
//	                                             ErrTimeout        → ErrUnreachable
//	Handler.Receive          sequential, in Step sequential per peer, concurrent
//	                                             across peers, on gRPC's goroutines
//
// grpcnet: the messages a Handler receives from a peer are a subsequence
// of those the peer's Transport queued for it, in queue order — never
// duplicated, never reordered, possibly with gaps. A gap comes from a
// broken stream: the batch on the wire and every message queued when the
// stream broke, or while it could not be opened, are dropped (and reported
// through Config.OnUnreachable), never resent; the sender reconnects with
// exponential backoff and jitter when there is more to send. A successful
// Send therefore means queued, not delivered; Raft tolerates exactly this
// (it resends what a follower lacks). Messages a peer sent before it was
// restarted are from another Transport: nothing orders them against the
// new one's. Calls and streams are not retried either: a broken connection
// fails them with ErrUnreachable, and the caller decides.
//
// memnet: each packet (a message, a request, a reply, a stream, a result)
// meets the faults of its one-way link when sent — lost with probability
// Drop, delayed by a latency drawn from [DelayMin, DelayMax] on the
// network's clock, taken out of the link's order with probability Reorder,
// delivered a second time with probability Duplicate — and is lost if its
// link is cut when it is sent or when it falls due, or if no node is there
// to take it. Without Reorder and Duplicate, a link is FIFO. A lost request
// or reply ends its Call with ErrTimeout once CallTimeout has passed on the
// network's clock. The same seed and the same calls give the same trace,
// byte for byte.
//
// # Invariants
//
//   - Node 0 is never a node; a node never sends to itself (ErrUnknownPeer).
//   - Every queue is bounded in bytes (Send's per peer, memnet's per link)
//     and so is every wire message (grpcnet: BatchBytes for a batch, a
//     request or a reply, ChunkBytes for a chunk). A full queue refuses
//     the whole Send and queues nothing.
//   - grpcnet: every RPC carries the sender's cluster id and node id and
//     the node id it is for; the receiver refuses another cluster
//     (ErrWrongCluster), a node not among its peers (ErrUnknownPeer) and
//     traffic meant for another node (ErrWrongNode) before anything reaches
//     its Handler. These ids name members; they do not authenticate them:
//     that is the job of the credentials (mTLS) in Config.DialOptions and
//     the server's options.
//   - grpcnet: one Handler.Receive at a time per peer. A peer's messages
//     are handed over only from its newest accepted stream: what is left
//     on a stream it gave up is dropped rather than delivered out of order.
//   - Every goroutine a Transport starts (grpcnet: a sender per peer, a
//     watcher per open stream, a goroutine per inbound SendStream that runs
//     ReceiveStream) is stopped and waited for by Close. Inbound RPCs run
//     on the gRPC server's goroutines, which its owner stops; after Close
//     they hand nothing to the Handler. memnet starts no goroutines.
//   - Errors are the sentinels of errors.go (errors.Is), a *RemoteError
//     for what the peer said, or the caller's context's error.
package transport
