package grpcnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/transport"
)

// peer is one peer's outgoing side: the connection, the queue of Send's
// messages, and (in runSender) the one goroutine that sends them.
type peer struct {
	id     transport.NodeID
	addr   string
	conn   *grpc.ClientConn
	client api.PeerClient
	wake   chan struct{} // capacity 1: something was queued
	rng    *rand.Rand    // backoff jitter; the sender's alone

	mu struct {
		sync.Mutex
		queue [][]byte
		bytes int // the payload bytes in queue
	}
}

// push queues msgs (total bytes) all or none, within limit bytes.
func (p *peer) push(msgs [][]byte, total, limit int) error {
	p.mu.Lock()
	if p.mu.bytes+total > limit {
		queued := p.mu.bytes
		p.mu.Unlock()
		return fmt.Errorf("grpcnet: %d bytes queued for peer %d: %w", queued, p.id, transport.ErrBackpressure)
	}
	p.mu.queue = append(p.mu.queue, msgs...)
	p.mu.bytes += total
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// take removes and returns the longest prefix of the queue that fits in
// room bytes encoded (at least one message, which Send made sure fits),
// or nil if the queue is empty.
func (p *peer) take(room int) [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, size, bytes := 0, 0, 0
	for _, m := range p.mu.queue {
		if e := entry(len(m)); n == 0 || size+e <= room {
			n, size, bytes = n+1, size+e, bytes+len(m)
			continue
		}
		break
	}
	if n == 0 {
		return nil
	}
	batch := p.mu.queue[:n:n]
	p.mu.queue = p.mu.queue[n:]
	if len(p.mu.queue) == 0 {
		p.mu.queue = nil // let the array go
	}
	p.mu.bytes -= bytes
	return batch
}

// dropAll empties the queue and returns how many messages it held.
func (p *peer) dropAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.mu.queue)
	p.mu.queue, p.mu.bytes = nil, 0
	return n
}

// runSender is the peer's sender. It waits for the first queued message,
// opens the Messages stream, and sends batches on it, in queue order,
// until the stream breaks; then it drops the queue, reports, waits out the
// backoff and opens a new stream, queue or no queue: once a peer has been
// sent to, its stream is kept up, so that the first message after a
// peer's recovery is not the one that finds the stream broken. It
// returns when ctx ends (Close).
func (t *Transport) runSender(ctx context.Context, p *peer) {
	defer t.senders.Done()
	failures := 0
	for {
		select {
		case <-p.wake:
		case <-ctx.Done():
			return
		}
		err := t.stream(ctx, p, &failures)
		if ctx.Err() != nil {
			return
		}
		failures++
		dropped := p.dropAll()
		t.cfg.Logger.Debug("transport: stream to peer broke", "peer", p.id, "dropped", dropped, "err", err)
		if t.cfg.OnUnreachable != nil {
			t.cfg.OnUnreachable(p.id, dropped, err)
		}
		timer := t.cfg.Clock.NewTimer(t.backoff(p, failures))
		select {
		case <-timer.Chan():
		case <-ctx.Done():
			timer.Stop()
			return
		}
		// Reconnect now, whether or not anything was queued meanwhile.
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// backoff is the wait after the failures-th failure in a row.
func (t *Transport) backoff(p *peer, failures int) time.Duration {
	d := t.cfg.BackoffBase
	for i := 1; i < failures && d < t.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, t.cfg.BackoffMax)
	j := t.cfg.BackoffJitter
	return time.Duration(float64(d) * (1 - j + 2*j*p.rng.Float64()))
}

// stream opens one Messages stream to p and sends on it until it breaks
// or ctx ends, returning why. Once the peer has accepted the stream,
// *failures is reset.
func (t *Transport) stream(ctx context.Context, p *peer, failures *int) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := p.client.Messages(t.outgoing(sctx, p.id))
	if err != nil {
		return fromStatus(ctx, false, p.id, err)
	}
	// The server accepts by sending its headers before it reads; a refusal
	// is a status with no headers.
	if md, err := s.Header(); err != nil || len(md.Get(mdAccepted)) == 0 {
		if err == nil {
			_, err = s.Recv()
		}
		return fromStatus(ctx, false, p.id, err)
	}
	*failures = 0
	// The watcher learns when the server ends the stream (it sends no
	// messages), which a sender with nothing to send would not notice.
	broken := make(chan error, 1)
	t.senders.Add(1)
	go func() {
		defer t.senders.Done()
		_, err := s.Recv()
		broken <- err
	}()
	defer func() {
		cancel()
		<-broken // the watcher has returned
	}()
	for {
		batch := p.take(t.cfg.BatchBytes)
		if batch == nil {
			select {
			case <-p.wake:
				continue
			case err := <-broken:
				broken <- err // for the deferred wait
				return fromStatus(ctx, false, p.id, orEOF(err))
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := s.Send(&api.PeerBatch{Msgs: batch}); err != nil {
			if err == io.EOF { // the stream ended; the watcher has its status
				err = <-broken
				broken <- err
			}
			return fromStatus(ctx, false, p.id, orEOF(err))
		}
	}
}

// errPeerEnded is why a stream broke that the server ended without error.
var errPeerEnded = errors.New("grpcnet: the peer ended the stream")

// orEOF makes a stream the server ended without error (io.EOF from Recv)
// an error: the sender did not end it.
func orEOF(err error) error {
	if err == nil || err == io.EOF {
		return errPeerEnded
	}
	return err
}
