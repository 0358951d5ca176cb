package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/server"
)

// frameCounter counts the HTTP/2 frames of each type in one direction of
// a connection, from the bytes as they pass.
type frameCounter struct {
	mu      sync.Mutex
	skip    int // bytes of the client's connection preface still to skip
	buf     []byte
	byType  map[byte]int
	written int // Write calls, for the sending direction
}

func (f *frameCounter) add(p []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.skip > 0 {
		n := min(f.skip, len(p))
		f.skip -= n
		p = p[n:]
	}
	f.buf = append(f.buf, p...)
	for len(f.buf) >= 9 {
		n := 9 + int(binary.BigEndian.Uint32(append([]byte{0}, f.buf[:3]...)))
		if len(f.buf) < n {
			break
		}
		f.byType[f.buf[3]]++
		f.buf = f.buf[n:]
	}
}

func (f *frameCounter) count(typ byte) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byType[typ]
}

// countedConn feeds what a client connection writes and reads to two
// frame counters.
type countedConn struct {
	net.Conn
	out, in *frameCounter
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.out.mu.Lock()
	c.out.written++
	c.out.mu.Unlock()
	c.out.add(p)
	return c.Conn.Write(p)
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.add(p[:n])
	return n, err
}

const framePing, frameData = 6, 0

// TestNoFlowControlPings: sequential calls, on the calls stream and as
// unary calls, cost no PING frames either way. gRPC's bandwidth-delay
// estimator, which the client and server turn off by setting static
// windows (api.StreamWindow), would ping after nearly every DATA frame
// received, and each ping and its ack is one more write system call.
func TestNoFlowControlPings(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token})
	for _, unary := range []bool{false, true} {
		out := &frameCounter{skip: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), byType: map[byte]int{}}
		in := &frameCounter{byType: map[byte]int{}}
		dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return &countedConn{Conn: c, out: out, in: in}, nil
		})
		c := dial(t, client.Config{Server: srv.Addr(), Entity: "frank", Secret: bytes.Repeat([]byte{9}, 32),
			AdminToken: token, UnaryCalls: unary, DialOptions: []grpc.DialOption{dialer}})
		const calls = 100
		for range calls {
			if _, err := c.TxState(ctx, "no-such-nonce"); err != nil {
				t.Fatal(err)
			}
		}
		sent, got := out.count(frameData), in.count(frameData)
		if sent < calls || got < calls {
			t.Fatalf("unary=%v: %d DATA frames sent and %d received for %d calls: the counter misreads the stream", unary, sent, got, calls)
		}
		if p, q := out.count(framePing), in.count(framePing); p+q > 0 {
			t.Errorf("unary=%v: %d calls cost %d PING frames sent and %d received, want none", unary, calls, p, q)
		}
		out.mu.Lock()
		writes := out.written
		out.mu.Unlock()
		t.Logf("unary=%v: %d calls, %d writes by the client", unary, calls, writes)
	}
}
