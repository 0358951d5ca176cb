package grpcnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/transport"
)

// Transport is a node's transport over gRPC. New makes it and starts one
// sender goroutine per peer; Register puts its service on the node's gRPC
// server; Close stops it.
type Transport struct {
	cfg Config
	h   transport.Handler
	// pmu guards peers and inbound: the peers we send to and accept,
	// Config.Peers and those AddPeer added.
	pmu     sync.RWMutex
	peers   map[transport.NodeID]*peer
	inbound map[transport.NodeID]*inbound
	opts    []grpc.DialOption
	ctx     context.Context    // the senders' context
	cancel  context.CancelFunc // ends it
	senders sync.WaitGroup     // senders and their stream watchers
	streams atomic.Uint64      // the last inbound stream token given
	closing atomic.Bool

	mu struct {
		sync.Mutex
		closed bool
		// calls holds the cancel function of every Call and SendStream in
		// flight and every Handler call running; Close cancels them all
		// and waits (idle) for the map to empty.
		calls  map[uint64]context.CancelFunc
		nextID uint64
		idle   *sync.Cond
	}
}

var _ transport.Transport = (*Transport)(nil)

// inbound is what the transport keeps of one peer's incoming messages.
type inbound struct {
	// mu serialises the peer's Receive calls and guards latest, the token
	// of the peer's newest Messages stream: only that stream delivers.
	mu     sync.Mutex
	latest uint64
}

// New makes a transport for the node cfg names, whose Handler is h, and
// starts its senders. They connect lazily, when there is something to
// send. Nothing reaches h until the service is registered on a serving
// gRPC server (Register).
func New(cfg Config, h transport.Handler) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: grpcnet: nil Handler", transport.ErrConfig)
	}
	t := &Transport{cfg: cfg, h: h, peers: make(map[transport.NodeID]*peer),
		inbound: make(map[transport.NodeID]*inbound)}
	t.mu.calls = make(map[uint64]context.CancelFunc)
	t.mu.idle = sync.NewCond(&t.mu.Mutex)
	bo := backoff.Config{BaseDelay: cfg.BackoffBase, Multiplier: 2, Jitter: cfg.BackoffJitter, MaxDelay: cfg.BackoffMax}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: cfg.DialTimeout}),
		grpc.WithStaticStreamWindowSize(api.StreamWindow),
		grpc.WithStaticConnWindowSize(api.ConnWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(max(cfg.BatchBytes, 4<<20)),
			grpc.MaxCallSendMsgSize(max(cfg.BatchBytes, cfg.ChunkBytes)+64)),
	}
	if cfg.KeepaliveTime > 0 {
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout}))
	}
	opts = append(opts, cfg.DialOptions...)
	t.opts = opts
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for id, addr := range cfg.Peers {
		if id == cfg.NodeID {
			continue
		}
		if err := t.AddPeer(id, addr); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// AddPeer adds peer id at addr to those the transport sends to and
// accepts traffic from (a member added to the cluster). Adding a peer it
// has at the same address does nothing; at another address it is
// transport.ErrConfig.
func (t *Transport) AddPeer(id transport.NodeID, addr string) error {
	if id == 0 || id == t.cfg.NodeID {
		return fmt.Errorf("%w: grpcnet: node %d cannot add peer %d", transport.ErrConfig, t.cfg.NodeID, id)
	}
	t.pmu.Lock()
	defer t.pmu.Unlock()
	if t.closing.Load() {
		return transport.ErrClosed
	}
	if p := t.peers[id]; p != nil {
		if p.addr != addr {
			return fmt.Errorf("%w: grpcnet: peer %d is at %q, not %q", transport.ErrConfig, id, p.addr, addr)
		}
		return nil
	}
	conn, err := grpc.NewClient(addr, t.opts...)
	if err != nil {
		return fmt.Errorf("%w: grpcnet: peer %d at %q: %w", transport.ErrConfig, id, addr, err)
	}
	p := &peer{id: id, addr: addr, conn: conn, client: api.NewPeerClient(conn), wake: make(chan struct{}, 1),
		rng: rand.New(rand.NewPCG(uint64(t.cfg.NodeID), uint64(id)))}
	t.peers[id] = p
	t.inbound[id] = &inbound{}
	t.senders.Add(1)
	go t.runSender(t.ctx, p)
	return nil
}

// peer returns peer id, or nil.
func (t *Transport) peer(id transport.NodeID) *peer {
	t.pmu.RLock()
	defer t.pmu.RUnlock()
	return t.peers[id]
}

// inboundOf returns what the transport keeps of peer id's traffic, or nil.
func (t *Transport) inboundOf(id transport.NodeID) *inbound {
	t.pmu.RLock()
	defer t.pmu.RUnlock()
	return t.inbound[id]
}

// Register puts the transport's service on s, the node's gRPC server,
// before it serves. The transport does not own s: whoever made it serves
// and stops it.
func (t *Transport) Register(s grpc.ServiceRegistrar) {
	api.RegisterPeerServer(s, &service{t: t})
}

// entry is what a message of n bytes takes in a batch or a request: its
// field tag, length and bytes.
func entry(n int) int { return 1 + protowire.SizeBytes(n) }

// Send queues msgs for peer to; see transport.Transport. The messages of
// one Send are queued all or none, and go in order after those queued
// before.
func (t *Transport) Send(to transport.NodeID, msgs ...[]byte) error {
	if t.closing.Load() {
		return transport.ErrClosed
	}
	p := t.peer(to)
	if p == nil {
		return fmt.Errorf("%w: node %d has no peer %d", transport.ErrUnknownPeer, t.cfg.NodeID, to)
	}
	total := 0
	for _, m := range msgs {
		if entry(len(m)) > t.cfg.BatchBytes {
			return fmt.Errorf("grpcnet: message of %d bytes over BatchBytes %d: %w", len(m), t.cfg.BatchBytes,
				transport.ErrTooLarge)
		}
		total += len(m)
	}
	return p.push(msgs, total, t.cfg.QueueBytes)
}

// track registers a call in flight (a Call or SendStream of ours, or a
// Handler call), returning its context, cancelled by Close, and the
// function that ends it; or ErrClosed.
func (t *Transport) track(parent context.Context) (context.Context, func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.closed {
		return nil, nil, transport.ErrClosed
	}
	ctx, cancel := context.WithCancel(parent)
	t.mu.nextID++
	id := t.mu.nextID
	t.mu.calls[id] = cancel
	return ctx, func() {
		cancel()
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.mu.calls, id)
		if len(t.mu.calls) == 0 {
			t.mu.idle.Broadcast()
		}
	}, nil
}

// Call sends req to peer to's Handler.Serve as a unary RPC; see
// transport.Transport. req must fit in BatchBytes (encoded).
func (t *Transport) Call(ctx context.Context, to transport.NodeID, req []byte) ([]byte, error) {
	p := t.peer(to)
	if p == nil {
		return nil, fmt.Errorf("%w: node %d has no peer %d", transport.ErrUnknownPeer, t.cfg.NodeID, to)
	}
	if entry(len(req)) > t.cfg.BatchBytes {
		return nil, fmt.Errorf("grpcnet: request of %d bytes over BatchBytes %d: %w", len(req), t.cfg.BatchBytes,
			transport.ErrTooLarge)
	}
	cctx, done, err := t.track(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	reply, err := p.client.Call(t.outgoing(cctx, to), &api.PeerRequest{Payload: req})
	if err != nil {
		return nil, fromStatus(ctx, t.closing.Load(), to, err)
	}
	return reply.Payload, nil
}

// SendStream sends r to peer to's Handler.ReceiveStream as a client stream
// of chunks of at most ChunkBytes; see transport.Transport. If r fails,
// the stream is cancelled (the receiver's reader fails) and SendStream
// returns r's error.
func (t *Transport) SendStream(ctx context.Context, to transport.NodeID, r io.Reader) error {
	p := t.peer(to)
	if p == nil {
		return fmt.Errorf("%w: node %d has no peer %d", transport.ErrUnknownPeer, t.cfg.NodeID, to)
	}
	sctx, done, err := t.track(ctx)
	if err != nil {
		return err
	}
	defer done()
	stream, err := p.client.Stream(t.outgoing(sctx, to))
	if err != nil {
		return fromStatus(ctx, t.closing.Load(), to, err)
	}
	for {
		// A new buffer each time: gRPC may keep a message after SendMsg.
		buf := make([]byte, t.cfg.ChunkBytes)
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := stream.Send(&api.PeerChunk{Data: buf[:n]}); err != nil {
				if err == io.EOF { // the receiver ended the stream: its status says how
					_, err = stream.CloseAndRecv()
					if err == nil {
						return nil
					}
				}
				return fromStatus(ctx, t.closing.Load(), to, err)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("grpcnet: reading the stream for peer %d: %w", to, rerr) // done cancels the stream
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return fromStatus(ctx, t.closing.Load(), to, err)
	}
	return nil
}

// Close stops the transport; see transport.Transport. It cancels every
// Call, SendStream and Handler call in flight and waits for them, stops
// every sender and waits for it, and closes the connections to the peers.
// The inbound RPCs of peers belong to the gRPC server: once Close has
// begun they hand nothing more to the Handler and end at their next
// message, or when the peer or the server ends them.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.mu.closed {
		t.mu.Unlock()
		return nil
	}
	t.mu.closed = true
	t.closing.Store(true)
	for _, cancel := range t.mu.calls {
		cancel()
	}
	for len(t.mu.calls) > 0 {
		t.mu.idle.Wait()
	}
	t.mu.Unlock()
	// AddPeer checks closing under pmu: past this point it adds no sender.
	t.pmu.Lock()
	peers := slices.Collect(maps.Values(t.peers))
	t.pmu.Unlock()
	t.cancel()
	t.senders.Wait()
	var errs []error
	for _, p := range peers {
		if err := p.conn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
