package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/kiroku-db/kiroku/api"
)

// h2Conn is an HTTP/2 client connection that speaks frames, as an
// attacker would: it sends what it likes and reads what the server says.
type h2Conn struct {
	t  *testing.T
	c  net.Conn
	fr *http2.Framer
}

func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	// A large window, so that the server's replies never wait on it.
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	return &h2Conn{t: t, c: c, fr: fr}
}

// call opens stream id for a unary method and sends the first body bytes
// of a request message that declares declared bytes, without ending it.
func (r *h2Conn) call(id uint32, method string, declared uint32, body int) {
	r.t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "kiroku"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		r.t.Fatal(err)
	}
	prefix := make([]byte, 5, 5+body)
	binary.BigEndian.PutUint32(prefix[1:], declared)
	data := append(prefix, bytes.Repeat([]byte{'x'}, body)...)
	for len(data) > 0 {
		n := min(len(data), 16<<10)
		if err := r.fr.WriteData(id, false, data[:n]); err != nil {
			r.t.Fatal(err)
		}
		data = data[n:]
	}
}

// ends reads frames until every stream in want has ended (a RST_STREAM, or
// headers that end the stream, with their grpc-status) or the deadline,
// and returns how each ended.
func (r *h2Conn) ends(want map[uint32]bool, deadline time.Time) map[uint32]string {
	r.t.Helper()
	got := map[uint32]string{}
	r.c.SetReadDeadline(deadline)
	for len(got) < len(want) {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("reading frames: %v (ended so far: %v)", err, got)
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if got[f.StreamID] == "" { // a reset after the status only ends our half
				got[f.StreamID] = "reset " + f.ErrCode.String()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				got[f.StreamID] = "grpc-status " + f.PseudoValue("status") + " " + headerValue(f, "grpc-status")
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				r.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				r.fr.WritePing(true, f.Data)
			}
		}
	}
	return got
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.Fields {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

func heapInUse() uint64 {
	runtime.GC() // twice: pooled buffers survive one collection
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestStalledRequestsAreBounded: clients that open calls, declare large
// request messages and stop sending part way — the audit's forty
// connections of streams holding megabytes each — can make the server
// hold at most MaxStreams calls per connection, each for BodyTimeout:
// further streams are refused, a declared message over MaxRequestBytes is
// refused at once, and every stalled call is ended and its bytes dropped.
func TestStalledRequestsAreBounded(t *testing.T) {
	const (
		conns   = 20
		streams = 4
		body    = 900 << 10 // under the stream window: sent without waiting
		timeout = 500 * time.Millisecond
	)
	r, err := Start(context.Background(), Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Transport: TransportLimits{MaxStreams: streams, BodyTimeout: timeout, MaxRequestBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(time.Second)
	base := heapInUse()

	raws := make([]*h2Conn, conns)
	start := time.Now()
	for i := range raws {
		raws[i] = dialH2(t, r.Addr())
		for s := range streams {
			raws[i].call(uint32(2*s+1), api.Ledger_GetAsset_FullMethodName, 1000<<10, body)
		}
		if i == 0 {
			// A stream beyond MaxStreams is refused (sent at once, while
			// the others are surely still open).
			raws[0].call(2*streams+1, api.Ledger_GetAsset_FullMethodName, 10, 0)
		}
	}
	// One that declares more than MaxRequestBytes is refused without
	// waiting for its bytes.
	big := dialH2(t, r.Addr())
	big.call(1, api.Ledger_GetAsset_FullMethodName, 64<<20, 1000)
	// (Had it waited for its bytes, the body timeout would have ended it
	// with another code.)
	if got := big.ends(map[uint32]bool{1: true}, time.Now().Add(10*timeout)); got[1] != "grpc-status 200 8" {
		t.Errorf("a message declared over MaxRequestBytes ended %q; want RESOURCE_EXHAUSTED (8) at once", got[1])
	}

	want := map[uint32]bool{}
	for s := range streams + 1 {
		want[uint32(2*s+1)] = true
	}
	for i, raw := range raws {
		w := want
		if i > 0 {
			w = map[uint32]bool{1: true, 3: true, 5: true, 7: true}
		}
		got := raw.ends(w, start.Add(10*timeout))
		for id := range w {
			switch {
			case id == 2*streams+1:
				if got[id] != "reset REFUSED_STREAM" {
					t.Errorf("connection %d: the stream over MaxStreams ended %q; want it refused", i, got[id])
				}
			case got[id] != "grpc-status 200 4" && got[id] != "grpc-status 200 1":
				t.Errorf("connection %d stream %d ended %q; want DEADLINE_EXCEEDED (4) or CANCELLED (1)", i, id, got[id])
			}
		}
	}
	if took := time.Since(start); took < timeout {
		t.Errorf("stalled calls ended after %v, before the body timeout %v", took, timeout)
	}
	// Their bytes are gone with them.
	held := int64(heapInUse()) - int64(base)
	if held > 16<<20 {
		t.Errorf("%d MiB still held after every stalled call ended (%d MiB were sent)", held>>20, conns*streams*body>>20)
	}
}
