package engine

import "testing"

// TestSpansStayBounded appends more spans than are kept and checks that
// truncation never cuts past what a checkpoint covers.
func TestSpansStayBounded(t *testing.T) {
	lg := &logger{}
	for i := uint64(1); i <= 3*maxSpans; i++ {
		lg.addSpan(logSpan{last: 10 * i, maxEpoch: i})
		lg.addSpan(logSpan{last: 10*i + 5, maxEpoch: i}) // same epoch: replaces
	}
	if len(lg.spans) > maxSpans {
		t.Fatalf("%d spans kept", len(lg.spans))
	}
	for i, sp := range lg.spans {
		if sp.last != 10*sp.maxEpoch+5 || (i > 0 && sp.maxEpoch <= lg.spans[i-1].maxEpoch) {
			t.Fatalf("span %d: %+v after %+v", i, sp, lg.spans[max(0, i-1)])
		}
	}
}

// TestFreeBuffersWarmestFirst checks the free list hands out the buffer
// written last first, keeps the newest when full, and drops a buffer a
// large transaction grew.
func TestFreeBuffersWarmestFirst(t *testing.T) {
	const size = 4 << 10
	lg := &logger{db: &DB{cfg: Config{LogBufferSize: size}}}
	bufs := make([]*logBuf, maxFree+8)
	for i := range bufs {
		bufs[i] = &logBuf{data: make([]byte, 0, size)}
	}
	grown := &logBuf{data: make([]byte, 0, 3*size)}
	lg.putFree(bufs[:4])
	lg.putFree([]*logBuf{grown})
	lg.putFree(bufs[4:])
	for i := len(bufs) - 1; i >= len(bufs)-maxFree; i-- {
		if b := lg.newBuf(7); b != bufs[i] {
			t.Fatalf("newBuf %d from the top: got another buffer than the one freed %d-th", len(bufs)-i, i)
		} else if b.epoch != 7 || len(b.data) != 2 || b.data[0] != recBuffer {
			t.Fatalf("reused buffer not reset: epoch %d, data %v", b.epoch, b.data)
		}
	}
	if b := lg.newBuf(7); cap(b.data) != size+size/4 || b == grown {
		t.Fatalf("an empty free list gave a buffer of capacity %d, want a new one", cap(b.data))
	}
}
