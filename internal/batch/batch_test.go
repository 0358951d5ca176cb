package batch

import (
	"slices"
	"testing"
)

// TestNext: a batch takes what is queued within its bounds, holds the item
// that does not fit for the next, lets a single item pass Room, and ends
// with the channel's close or done.
func TestNext(t *testing.T) {
	c := make(chan int, 16)
	q := Queue[int]{C: c, Size: func(n int) int { return n }, Room: 10, Most: 3}
	for _, n := range []int{4, 5, 2, 1, 1, 1, 1, 30, 3} {
		c <- n
	}
	close(c)
	var got [][]int
	for {
		b, ok := q.Next(nil, nil)
		if !ok {
			break
		}
		got = append(got, b)
	}
	want := [][]int{{4, 5}, {2, 1, 1}, {1, 1}, {30}, {3}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", got, want)
	}

	done := make(chan struct{})
	close(done)
	if b, ok := (&Queue[int]{C: make(chan int), Size: func(int) int { return 1 }, Room: 1}).Next(nil, done); ok || len(b) != 0 {
		t.Fatalf("with done closed and nothing queued: %v, %v; want nothing, false", b, ok)
	}
}
