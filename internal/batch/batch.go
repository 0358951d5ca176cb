// Package batch gathers the items queued on a channel into messages: the
// client's calls and the server's replies on a CallBatches stream.
package batch

import (
	"runtime"

	"google.golang.org/protobuf/encoding/protowire"
)

// Entry is what an item of n bytes takes in a protobuf message of them (a
// repeated message field): its tag, length and bytes.
func Entry(n int) int { return 1 + protowire.SizeBytes(n) }

// Queue takes items from C in batches. A batch holds the first item that
// arrives and then every item already queued, up to Most items and Room
// bytes by Size (a single item may be larger than Room). An item taken
// that does not fit is held for the next batch.
type Queue[T any] struct {
	C    <-chan T
	Size func(T) int
	Room int
	Most int // 0: no bound on the count

	held    T
	hasHeld bool
}

// Next returns the next batch, appended to dst, waiting for its first
// item. It returns ok false once C is closed and drained, or done is
// closed while it waits (done may be nil).
//
// The goroutine that sends batches is woken by the first item queued,
// before the goroutines about to queue theirs have run, so if nothing else
// is queued yet it yields the processor once before it fills the batch;
// with nothing else runnable Gosched returns at once, and a lone item
// waits for nothing.
func (q *Queue[T]) Next(dst []T, done <-chan struct{}) (batch []T, ok bool) {
	var first T
	if q.hasHeld {
		var zero T
		first, q.held, q.hasHeld = q.held, zero, false
	} else {
		select {
		case first, ok = <-q.C:
			if !ok {
				return dst, false
			}
		case <-done:
			return dst, false
		}
	}
	batch, size := append(dst, first), q.Size(first)
	if len(q.C) == 0 {
		runtime.Gosched()
	}
	for q.Most == 0 || len(batch) < q.Most {
		select {
		case x, open := <-q.C:
			if !open {
				return batch, true // the next call reports the close
			}
			if n := q.Size(x); size+n <= q.Room {
				batch, size = append(batch, x), size+n
				continue
			}
			q.held, q.hasHeld = x, true
			return batch, true
		default:
			return batch, true
		}
	}
	return batch, true
}
