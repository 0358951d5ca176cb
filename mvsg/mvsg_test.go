package mvsg

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func tx(id string, begin, end int64, reads, writes map[string]int64) *Txn {
	if reads == nil {
		reads = map[string]int64{}
	}
	if writes == nil {
		writes = map[string]int64{}
	}
	return &Txn{ID: id, Begin: begin, End: end, Reads: reads, Writes: writes, Focus: true}
}

type rw = map[string]int64

func kinds(as []Anomaly) []AnomalyKind {
	var out []AnomalyKind
	for _, a := range as {
		out = append(out, a.Kind)
	}
	return out
}

// TestAnomalies: each history shows exactly the anomaly it was built to
// show, and a serial one shows none.
func TestAnomalies(t *testing.T) {
	for _, c := range []struct {
		name string
		txs  []*Txn
		want []AnomalyKind
		txs0 []string // the first anomaly's transactions, if given
	}{
		{"serial", []*Txn{
			tx("a", 1, 2, rw{"x": -1}, rw{"x": 0}),
			tx("b", 3, 4, rw{"x": 0}, rw{"x": 1}),
			tx("c", 5, 6, rw{"x": 1, "y": -1}, nil),
		}, nil, nil},
		{"concurrent, serializable", []*Txn{
			tx("a", 1, 4, rw{"x": 0}, rw{"x": 1}),
			tx("b", 2, 3, rw{"x": 0}, nil), // read the old version while a ran
		}, nil, nil},
		{"write skew", []*Txn{
			tx("a", 1, 4, rw{"x": 0, "y": 0}, rw{"x": 1}),
			tx("b", 2, 5, rw{"x": 0, "y": 0}, rw{"y": 1}),
		}, []AnomalyKind{Cycle}, []string{"a", "b"}},
		{"lost update", []*Txn{
			tx("a", 1, 4, rw{"x": 0}, rw{"x": 1}),
			tx("b", 2, 5, rw{"x": 0}, rw{"x": 1}),
		}, []AnomalyKind{Cycle, DuplicateVersion}, []string{"a", "b"}}, // each read what the other replaced
		{"stale read", []*Txn{
			tx("w", 1, 2, rw{"x": 0}, rw{"x": 1}),
			tx("r", 3, 4, rw{"x": 0}, nil), // began after w finished, read what w replaced
		}, []AnomalyKind{StaleRead}, []string{"r", "w"}},
		{"future read", []*Txn{
			tx("r", 1, 2, rw{"x": 1}, nil),
			tx("w", 3, 4, rw{"x": 0}, rw{"x": 1}),
		}, []AnomalyKind{FutureRead}, []string{"r", "w"}},
		{"version order", []*Txn{
			tx("late", 3, 4, nil, rw{"x": 0}),
			tx("early", 1, 2, nil, rw{"x": 1}), // its version follows one written after it finished
		}, []AnomalyKind{VersionOrder}, []string{"late", "early"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Build(c.txs).Anomalies()
			if !slices.Equal(kinds(got), c.want) {
				t.Fatalf("anomalies %v, want %v: %+v", kinds(got), c.want, got)
			}
			if c.txs0 != nil && !slices.Equal(got[0].Txs, c.txs0) {
				t.Fatalf("%s involves %v, want %v", got[0].Kind, got[0].Txs, c.txs0)
			}
			for _, a := range got {
				if a.Detail == "" || len(a.Txs) < 2 {
					t.Fatalf("anomaly without detail or transactions: %+v", a)
				}
			}
		})
	}
}

// TestFocus: an anomaly among context transactions only is not reported;
// the same one with a focus transaction in it is.
func TestFocus(t *testing.T) {
	a := tx("a", 1, 4, rw{"x": 0, "y": 0}, rw{"x": 1})
	b := tx("b", 2, 5, rw{"x": 0, "y": 0}, rw{"y": 1})
	a.Focus, b.Focus = false, false
	if got := Build([]*Txn{a, b}).Anomalies(); len(got) != 0 {
		t.Fatalf("context-only anomalies reported: %+v", got)
	}
	b.Focus = true
	if got := Build([]*Txn{a, b}).Anomalies(); len(got) != 1 || got[0].Kind != Cycle {
		t.Fatalf("with a focus transaction: %+v", got)
	}
}

// TestCycleEdges: a reported cycle is a closed walk of the graph's edges.
func TestCycleEdges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var txs []*Txn
		ages := map[string]int64{"a": 0, "b": 0, "c": 0}
		for i := range 12 {
			r, w := rw{}, rw{}
			for _, k := range []string{"a", "b", "c"} {
				switch rng.IntN(3) {
				case 0:
					r[k] = ages[k] - int64(rng.IntN(2)) // sometimes a stale version
				case 1:
					r[k] = ages[k]
					ages[k]++
					w[k] = ages[k]
				}
			}
			txs = append(txs, tx(string(rune('A'+i)), int64(i), int64(i+20), r, w)) // all overlap: no real-time edges
		}
		for _, an := range Build(txs).Anomalies() {
			if an.Kind != Cycle {
				continue
			}
			for i, e := range an.Edges {
				next := an.Edges[(i+1)%len(an.Edges)]
				if e.To != next.From {
					t.Fatalf("cycle edges do not chain: %+v", an.Edges)
				}
			}
		}
	}
	if n, e := Build(nil).Size(); n != 0 || e != 0 {
		t.Fatalf("empty graph size %d %d", n, e)
	}
}
