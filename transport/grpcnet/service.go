package grpcnet

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/transport"
)

// service is the Peer service: the receiving side of a Transport. Its
// methods run on the gRPC server's goroutines.
type service struct {
	api.UnimplementedPeerServer
	t *Transport
}

// handlerError is the status of a Handler's error.
func handlerError(err error) error { return withReason(codes.Unknown, reasonRemote, err.Error()) }

// Messages receives one peer's batches and hands them to the Handler, in
// order, unless a newer stream from the same peer has been accepted since
// (the sender has given this one up; what is left on it is dropped, so a
// peer's messages are never reordered nor handed over concurrently).
func (s *service) Messages(stream api.Peer_MessagesServer) error {
	t := s.t
	if t.closing.Load() {
		return toStatus(transport.ErrClosed)
	}
	from, err := t.admit(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	in := t.inboundOf(from)
	token := t.streams.Add(1)
	in.mu.Lock()
	in.latest = token
	in.mu.Unlock()
	// The stream lasts as long as the peer keeps it, unless the transport
	// closes first: Close then ends it (its Recv would wait for the peer).
	tctx, done, err := t.track(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	defer done()
	if err := stream.SendHeader(metadata.Pairs(mdAccepted, "1")); err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() { ended <- t.receive(stream, in, token, from) }()
	select {
	case err := <-ended:
		return err
	case <-tctx.Done():
		if t.closing.Load() {
			return toStatus(transport.ErrClosed)
		}
		return <-ended
	}
}

// receive delivers what a Messages stream carries until it ends.
func (t *Transport) receive(stream api.Peer_MessagesServer, in *inbound, token uint64, from transport.NodeID) error {
	for {
		b, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := t.deliver(in, token, from, b.Msgs); err != nil {
			return err
		}
	}
}

func (t *Transport) deliver(in *inbound, token uint64, from transport.NodeID, msgs [][]byte) error {
	_, done, err := t.track(context.Background())
	if err != nil {
		return toStatus(err)
	}
	defer done()
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.latest != token {
		return status.Error(codes.Aborted, "grpcnet: a newer stream from the same peer replaced this one")
	}
	if len(msgs) > 0 {
		t.h.Receive(from, msgs)
	}
	return nil
}

// Call runs the Handler's Serve.
func (s *service) Call(ctx context.Context, req *api.PeerRequest) (*api.PeerReply, error) {
	t := s.t
	from, err := t.admit(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	hctx, done, err := t.track(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	defer done()
	reply, err := t.h.Serve(hctx, from, req.Payload)
	if err != nil {
		if t.closing.Load() {
			return nil, toStatus(transport.ErrClosed)
		}
		return nil, handlerError(err)
	}
	if entry(len(reply)) > t.cfg.BatchBytes {
		return nil, toStatus(fmt.Errorf("%w: reply of %d bytes over BatchBytes %d", transport.ErrTooLarge, len(reply),
			t.cfg.BatchBytes))
	}
	return &api.PeerReply{Payload: reply}, nil
}

// chunk is one Recv of a Stream: a chunk's data, or the error that ended
// the stream (io.EOF at its end).
type chunk struct {
	data []byte
	err  error
}

// Stream runs the Handler's ReceiveStream on a goroutine of the
// transport's, which Close can stop, and feeds it the chunks this one
// (the gRPC server's) receives. Only this goroutine touches the stream.
func (s *service) Stream(stream api.Peer_StreamServer) error {
	t := s.t
	from, err := t.admit(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	hctx, done, err := t.track(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	chunks := make(chan chunk)
	result := make(chan error, 1)
	r := &streamReader{ctx: hctx, chunks: chunks, max: t.cfg.ChunkBytes, from: from}
	go func() {
		defer done()
		result <- t.h.ReceiveStream(hctx, from, r)
	}()
	var herr error
	for received := true; received; {
		m, err := stream.Recv()
		c := chunk{err: err}
		if err == nil {
			c.data = m.Data
		}
		select {
		case chunks <- c:
			if err != nil {
				herr = <-result
				received = false
			}
		case herr = <-result:
			received = false
		}
	}
	switch {
	case r.tooLarge: // read only by the handler's goroutine, which has returned
		return toStatus(r.err)
	case herr != nil && t.closing.Load():
		return toStatus(transport.ErrClosed)
	case herr != nil:
		return handlerError(herr)
	}
	return stream.SendAndClose(&api.PeerStreamReply{})
}

// streamReader is the io.Reader a ReceiveStream reads.
type streamReader struct {
	ctx      context.Context
	chunks   <-chan chunk
	max      int
	from     transport.NodeID
	cur      []byte
	err      error
	tooLarge bool
}

func (r *streamReader) Read(b []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		select {
		case c := <-r.chunks:
			switch {
			case c.err == io.EOF:
				r.err = io.EOF
			case c.err != nil:
				r.err = fmt.Errorf("grpcnet: the stream from peer %d broke: %w: %w", r.from, transport.ErrUnreachable, c.err)
			case len(c.data) > r.max:
				r.tooLarge = true
				r.err = fmt.Errorf("%w: chunk of %d bytes over ChunkBytes %d", transport.ErrTooLarge, len(c.data), r.max)
			default:
				r.cur = c.data
			}
		case <-r.ctx.Done():
			r.err = fmt.Errorf("grpcnet: the stream from peer %d: %w", r.from, r.ctx.Err())
		}
	}
	if len(b) == 0 {
		return 0, nil
	}
	n := copy(b, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}
