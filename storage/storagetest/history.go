package storagetest

import (
	"fmt"
	"slices"
	"strings"
)

// This file checks a recorded transaction history for strict
// serializability, in the style of Elle's list-append checker: every key
// holds a list, and transactions append unique elements to it. Because an
// element is never written twice, the final list of each key reveals the
// version order, and every read reveals exactly which writes it saw. From
// that the checker builds the dependency graph and asserts it has no cycle:
//
//	ww  T1 → T2  T2 appended to a key right after T1 in its version order
//	wr  T1 → T2  T2 read a version whose last element T1 appended
//	rw  T1 → T2  T1 read a version that T2's append then replaced
//	rt  T1 → T2  T1 committed before T2 began (real time)
//
// A history is serializable iff ww ∪ wr ∪ rw is acyclic, and strictly
// serializable iff that stays true with the rt edges added (Adya's DSG,
// extended with real-time order).

// Op is one operation of a transaction on a list-valued key.
type Op struct {
	Key int
	// Append is the element appended, unique in the whole history; 0 for a read.
	Append int
	// Read is the list observed, for a read; reads made after the
	// transaction's own append to the key include that append.
	Read []int
	// IsRead marks a read (a read may observe an empty list).
	IsRead bool
}

// Txn is one transaction attempt.
type Txn struct {
	ID         int
	Begin, End int64 // logical times: Begin taken before Begin(), End after Commit returned
	Ops        []Op
	Committed  bool
	// Unknown marks a commit whose outcome is unknown (ErrCommitUnknown):
	// its appends may appear; it is then treated as committed without reads.
	Unknown bool
}

// History is a set of transactions and the final state of every key.
type History struct {
	Txns  []*Txn
	Final map[int][]int // key → final list
}

// Edge is one dependency in the graph.
type Edge struct {
	From, To int // transaction ids
	Kind     string
	Key      int
}

func (e Edge) String() string {
	if e.Kind == "rt" {
		return fmt.Sprintf("T%d -rt-> T%d", e.From, e.To)
	}
	return fmt.Sprintf("T%d -%s(k%d)-> T%d", e.From, e.Kind, e.Key, e.To)
}

// Check returns nil if the history is strictly serializable, or an error
// describing the first anomaly found: a lost or duplicated append, a read
// that is not a prefix of the final list (or is internally inconsistent), or
// a dependency cycle with its edges.
func (h *History) Check() error {
	byID := map[int]*Txn{}
	writer := map[int]*Txn{} // element → the transaction that appended it
	for _, t := range h.Txns {
		if byID[t.ID] != nil {
			return fmt.Errorf("history: duplicate transaction id %d", t.ID)
		}
		byID[t.ID] = t
		for _, op := range t.Ops {
			if op.IsRead {
				continue
			}
			if w := writer[op.Append]; w != nil {
				return fmt.Errorf("history: element %d appended by T%d and T%d", op.Append, w.ID, t.ID)
			}
			writer[op.Append] = t
		}
	}
	// Which transactions count: committed, and unknown ones whose appends
	// are visible.
	live := map[int]bool{}
	for _, t := range h.Txns {
		if t.Committed {
			live[t.ID] = true
		}
	}
	for _, list := range h.Final {
		for _, e := range list {
			if w := writer[e]; w != nil && w.Unknown {
				live[w.ID] = true
			}
		}
	}
	// 1. Final lists: every element from a live writer, each exactly once,
	// and every live append present.
	pos := map[int]map[int]int{} // key → element → index in final list
	for k, list := range h.Final {
		pos[k] = map[int]int{}
		for i, e := range list {
			if _, dup := pos[k][e]; dup {
				return fmt.Errorf("history: key %d: element %d appears twice in %v", k, e, list)
			}
			pos[k][e] = i
			w := writer[e]
			if w == nil {
				return fmt.Errorf("history: key %d: element %d was never appended", k, e)
			}
			if !live[w.ID] {
				return fmt.Errorf("history: key %d: element %d of aborted transaction T%d is visible", k, e, w.ID)
			}
		}
	}
	for _, t := range h.Txns {
		if !live[t.ID] {
			continue
		}
		for _, op := range t.Ops {
			if op.IsRead {
				continue
			}
			if _, ok := pos[op.Key][op.Append]; !ok {
				return fmt.Errorf("history: T%d's committed append %d to key %d is lost: final %v",
					t.ID, op.Append, op.Key, h.Final[op.Key])
			}
		}
	}
	var edges []Edge
	add := func(from, to int, kind string, key int) {
		if from != to {
			edges = append(edges, Edge{from, to, kind, key})
		}
	}
	// 2. ww edges from the version order.
	for k, list := range h.Final {
		for i := 1; i < len(list); i++ {
			add(writer[list[i-1]].ID, writer[list[i]].ID, "ww", k)
		}
	}
	// 3. wr and rw edges from reads; reads must be prefixes of the final list.
	for _, t := range h.Txns {
		if !t.Committed {
			continue // reads of aborted or unknown transactions prove nothing
		}
		own := map[int][]int{} // key → own appends so far
		for _, op := range t.Ops {
			if !op.IsRead {
				own[op.Key] = append(own[op.Key], op.Append)
				continue
			}
			final := h.Final[op.Key]
			// What the read saw from others: strip own appends from the end.
			seen := op.Read
			mine := own[op.Key]
			if len(mine) > 0 {
				if len(seen) < len(mine) || !slices.Equal(seen[len(seen)-len(mine):], mine) {
					return fmt.Errorf("history: T%d read %v of key %d without its own appends %v", t.ID, op.Read, op.Key, mine)
				}
				seen = seen[:len(seen)-len(mine)]
			}
			if len(seen) > len(final) || !slices.Equal(seen, final[:len(seen)]) {
				return fmt.Errorf("history: T%d read %v of key %d, which is not a prefix of the final %v", t.ID, op.Read, op.Key, final)
			}
			if len(seen) > 0 {
				add(writer[seen[len(seen)-1]].ID, t.ID, "wr", op.Key)
			}
			if len(seen) < len(final) {
				add(t.ID, writer[final[len(seen)]].ID, "rw", op.Key)
			}
		}
	}
	// 4. Real-time edges between live transactions, unknown ones included:
	// one whose appends are visible committed between its Begin and End.
	// Sorting by End lets us add, for each transaction, only the edges from
	// the ones that ended before it began; the quadratic worst case is fine
	// at test sizes.
	var lv []*Txn
	for _, t := range h.Txns {
		if live[t.ID] {
			lv = append(lv, t)
		}
	}
	slices.SortFunc(lv, func(a, b *Txn) int { return int(a.End - b.End) })
	for _, t2 := range lv {
		for _, t1 := range lv {
			if t1.End >= t2.Begin {
				break
			}
			add(t1.ID, t2.ID, "rt", 0)
		}
	}
	if cyc := findCycle(edges); cyc != nil {
		parts := make([]string, len(cyc))
		for i, e := range cyc {
			parts[i] = e.String()
		}
		return fmt.Errorf("history: dependency cycle: %s", strings.Join(parts, ", "))
	}
	return nil
}

// findCycle returns the edges of one cycle in the graph, or nil. It is an
// iterative depth-first search, O(V+E).
func findCycle(edges []Edge) []Edge {
	adj := map[int][]Edge{}
	var nodes []int
	seen := map[int]bool{}
	for _, e := range edges {
		adj[e.From] = append(adj[e.From], e)
		for _, n := range []int{e.From, e.To} {
			if !seen[n] {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	const (
		white = iota
		grey
		black
	)
	color := map[int]int{}
	type frame struct {
		node int
		next int  // index of the next edge to follow
		via  Edge // the edge that led here
	}
	for _, root := range nodes {
		if color[root] != white {
			continue
		}
		stack := []frame{{node: root}}
		color[root] = grey
		for len(stack) > 0 {
			f := &stack[len(stack)-1]
			if f.next == len(adj[f.node]) {
				color[f.node] = black
				stack = stack[:len(stack)-1]
				continue
			}
			e := adj[f.node][f.next]
			f.next++
			switch color[e.To] {
			case white:
				color[e.To] = grey
				stack = append(stack, frame{node: e.To, via: e})
			case grey:
				// Back edge: the cycle is the stack from e.To to here, plus e.
				var cyc []Edge
				for i := len(stack) - 1; stack[i].node != e.To; i-- {
					cyc = append(cyc, stack[i].via)
				}
				slices.Reverse(cyc)
				return append(cyc, e)
			}
		}
	}
	return nil
}
