package storagetest

import (
	"strings"
	"testing"
)

// Each case is a tiny history with a known verdict; the anomalous ones prove
// the checker can fail.
func TestHistoryCheck(t *testing.T) {
	r := func(k int, l ...int) Op { return Op{Key: k, Read: l, IsRead: true} }
	a := func(k, e int) Op { return Op{Key: k, Append: e} }
	tx := func(id int, b, e int64, ops ...Op) *Txn {
		return &Txn{ID: id, Begin: b, End: e, Ops: ops, Committed: true}
	}
	cases := []struct {
		name string
		h    History
		want string // "" for valid, else a substring of the error
	}{
		{"serial", History{
			Txns:  []*Txn{tx(1, 1, 2, r(0), a(0, 1)), tx(2, 3, 4, r(0, 1), a(0, 2))},
			Final: map[int][]int{0: {1, 2}},
		}, ""},
		{"concurrent but serializable", History{
			Txns:  []*Txn{tx(1, 1, 4, r(0), a(0, 1)), tx(2, 2, 3, r(1), a(1, 2))},
			Final: map[int][]int{0: {1}, 1: {2}},
		}, ""},
		{"read own append", History{
			Txns:  []*Txn{tx(1, 1, 2, a(0, 1), r(0, 1))},
			Final: map[int][]int{0: {1}},
		}, ""},
		{"lost update", History{
			// Both read the empty list, both append: T2's read misses T1.
			Txns:  []*Txn{tx(1, 1, 4, r(0), a(0, 1)), tx(2, 2, 3, r(0), a(0, 2))},
			Final: map[int][]int{0: {1, 2}},
		}, "cycle"},
		{"write skew", History{
			// Each reads both keys empty and appends to a different one.
			Txns: []*Txn{
				tx(1, 1, 4, r(0), r(1), a(0, 1)),
				tx(2, 2, 3, r(0), r(1), a(1, 2)),
			},
			Final: map[int][]int{0: {1}, 1: {2}},
		}, "cycle"},
		{"stale read", History{
			// T1 commits, then T2 begins and still reads the empty list.
			Txns:  []*Txn{tx(1, 1, 2, a(0, 1)), tx(2, 3, 4, r(0))},
			Final: map[int][]int{0: {1}},
		}, "-rt->"},
		{"not a prefix", History{
			Txns:  []*Txn{tx(1, 1, 2, a(0, 1)), tx(2, 3, 4, a(0, 2)), tx(3, 5, 6, r(0, 2))},
			Final: map[int][]int{0: {1, 2}},
		}, "not a prefix"},
		{"lost append", History{
			Txns:  []*Txn{tx(1, 1, 2, a(0, 1)), tx(2, 3, 4, a(0, 2))},
			Final: map[int][]int{0: {2}},
		}, "lost"},
		{"aborted write visible", History{
			Txns:  []*Txn{{ID: 1, Begin: 1, End: 2, Ops: []Op{a(0, 1)}}},
			Final: map[int][]int{0: {1}},
		}, "aborted"},
		{"duplicate element", History{
			Txns:  []*Txn{tx(1, 1, 2, a(0, 1))},
			Final: map[int][]int{0: {1, 1}},
		}, "twice"},
		{"unknown commit may appear", History{
			Txns:  []*Txn{{ID: 1, Begin: 1, End: 2, Ops: []Op{a(0, 1)}, Unknown: true}, tx(2, 3, 4, r(0, 1))},
			Final: map[int][]int{0: {1}},
		}, ""},
		{"stale read of an unknown commit", History{
			// T1's outcome was unknown but its append is visible, so it
			// committed before its End; T2 began after and missed it.
			Txns:  []*Txn{{ID: 1, Begin: 1, End: 2, Ops: []Op{a(0, 1)}, Unknown: true}, tx(2, 3, 4, r(0))},
			Final: map[int][]int{0: {1}},
		}, "-rt->"},
		{"read misses own append", History{
			Txns:  []*Txn{tx(1, 1, 2, a(0, 1), r(0))},
			Final: map[int][]int{0: {1}},
		}, "own appends"},
		{"long cycle through three keys", History{
			Txns: []*Txn{
				tx(1, 1, 10, r(0), a(1, 1)),
				tx(2, 2, 10, r(1), a(2, 2)),
				tx(3, 3, 10, r(2), a(0, 3)),
			},
			Final: map[int][]int{0: {3}, 1: {1}, 2: {2}},
		}, "cycle"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.h.Check()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("valid history rejected: %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("anomaly %q not found", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}
