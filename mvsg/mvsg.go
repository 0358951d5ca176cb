// Package mvsg is the multi-version serialization graph of a set of
// committed transactions, and the anomalies it reveals: dependency cycles
// (no serial order explains the transactions), dependencies that run
// against real time (stale reads, reads from the future, versions
// ordered after a writer that began later), and versions that more than
// one transaction wrote. It is pure code — no storage, no clock, no
// goroutines — shared by the detectors that check a ledger's history:
// the Validator after the fact, the Auditor as it goes.
//
// A transaction is its accesses: for each key, the version (age) it read
// (-1: the key was absent) and the version it wrote, and the logical
// clock interval [Begin, End] it ran in. Versions of a key are numbered
// 0, 1, 2, ...: writing age a replaces age a−1. Only anomalies that
// involve a focus transaction are reported; the others are context.
package mvsg

import (
	"fmt"
	"maps"
	"slices"
)

// EdgeKind names a dependency between two transactions.
type EdgeKind string

const (
	// EdgeWR: To read the version From wrote (reads-from).
	EdgeWR EdgeKind = "wr"
	// EdgeWW: To wrote the version after From's (version order).
	EdgeWW EdgeKind = "ww"
	// EdgeRW: From read a version To replaced (anti-dependency).
	EdgeRW EdgeKind = "rw"
)

// Edge is a dependency From → To: in any serial order equivalent to the
// history, From comes first. Key and Age name the version it is about: the
// one read (wr), the later one written (ww, rw).
type Edge struct {
	From string   `json:"from"`
	To   string   `json:"to"`
	Kind EdgeKind `json:"kind"`
	Key  string   `json:"key"`
	Age  int64    `json:"age"`
}

// Txn is one committed transaction as the graph sees it.
type Txn struct {
	ID         string
	Begin, End int64
	Reads      map[string]int64 // key → age read (-1: read absent)
	Writes     map[string]int64 // key → age written
	Focus      bool             // being checked now (not only context)
}

// Graph is the MVSG over a set of transactions.
type Graph struct {
	nodes []*Txn
	out   [][]int // out[i]: indexes into edges
	edges []graphEdge
	dups  []dupVersion
}

type graphEdge struct {
	from, to int
	kind     EdgeKind
	key      string
	age      int64
}

// dupVersion is a version that more than one committed transaction wrote.
type dupVersion struct {
	key     string
	age     int64
	writers []int
}

// Size is the graph's node and edge counts.
func (g *Graph) Size() (nodes, edges int) { return len(g.nodes), len(g.edges) }

// AnomalyKind names what a check found.
type AnomalyKind string

const (
	// Cycle: committed transactions form a cycle; no serial order
	// explains them.
	Cycle AnomalyKind = "dependency_cycle"
	// StaleRead: a transaction read a version that another had replaced
	// and finished replacing before the reader began.
	StaleRead AnomalyKind = "stale_read"
	// FutureRead: a transaction read a version written by one that began
	// after the reader finished.
	FutureRead AnomalyKind = "future_read"
	// VersionOrder: a version follows another whose writer began only
	// after the later version's writer finished.
	VersionOrder AnomalyKind = "version_order"
	// DuplicateVersion: more than one committed transaction wrote the
	// same version.
	DuplicateVersion AnomalyKind = "duplicate_version"
)

// Anomaly is one finding: its kind, the transactions (IDs) involved, the
// version it is about, the dependencies that show it, and a sentence.
type Anomaly struct {
	Kind   AnomalyKind
	Txs    []string
	Key    string
	Age    int64
	Edges  []Edge
	Detail string
}

// Anomalies runs every check and returns what involves a focus
// transaction: one cycle from each strongly connected component, then the
// dependencies that contradict real time, then the duplicated versions.
func (g *Graph) Anomalies() []Anomaly {
	var out []Anomaly
	for _, c := range g.cycles() {
		a := Anomaly{Kind: Cycle, Detail: fmt.Sprintf("%d transactions form a cycle; no serial order explains them", len(c))}
		for _, e := range c {
			a.Edges = append(a.Edges, g.edge(e))
			a.Txs = append(a.Txs, g.nodes[e.from].ID)
		}
		a.Key, a.Age = c[0].key, c[0].age
		out = append(out, a)
	}
	for _, e := range g.realTimeViolations() {
		f, t := g.nodes[e.from], g.nodes[e.to]
		a := Anomaly{Txs: []string{f.ID, t.ID}, Key: e.key, Age: e.age, Edges: []Edge{g.edge(e)}}
		switch e.kind {
		case EdgeRW:
			a.Kind = StaleRead
			a.Detail = fmt.Sprintf("%s read %s@%d, but %s had written %s@%d and finished (end clock %d) before it began (begin clock %d)",
				f.ID, e.key, e.age-1, t.ID, e.key, e.age, t.End, f.Begin)
		case EdgeWR:
			a.Kind = FutureRead
			a.Detail = fmt.Sprintf("%s read %s@%d, written by %s, which began (begin clock %d) after the reader finished (end clock %d)",
				t.ID, e.key, e.age, f.ID, f.Begin, t.End)
			a.Txs = []string{t.ID, f.ID}
		default:
			a.Kind = VersionOrder
			a.Detail = fmt.Sprintf("%s@%d (by %s) follows %s@%d (by %s), whose writer began (begin clock %d) after it finished (end clock %d)",
				e.key, e.age, t.ID, e.key, e.age-1, f.ID, f.Begin, t.End)
		}
		out = append(out, a)
	}
	for _, d := range g.dups {
		a := Anomaly{Kind: DuplicateVersion, Key: d.key, Age: d.age,
			Detail: fmt.Sprintf("%d committed transactions wrote %s@%d", len(d.writers), d.key, d.age)}
		focus := false
		for _, w := range d.writers {
			a.Txs = append(a.Txs, g.nodes[w].ID)
			focus = focus || g.nodes[w].Focus
		}
		if focus {
			out = append(out, a)
		}
	}
	return out
}

// Build builds the graph of txns. It adds, for every version (key, a): ww from the writers of a−1
// to the writers of a; wr from the writers of a to its readers; rw from the
// readers of a−1 to the writers of a. A transaction is never linked to
// itself. Edges are O(accesses) except where a version has several writers
// or a version both many readers and several successors.
func Build(txns []*Txn) *Graph {
	nodes := txns
	g := &Graph{nodes: nodes, out: make([][]int, len(nodes))}
	type ka struct {
		key string
		age int64
	}
	writers := map[ka][]int{}
	readers := map[ka][]int{}
	for i, n := range nodes {
		for k, a := range n.Writes {
			writers[ka{k, a}] = append(writers[ka{k, a}], i)
		}
		for k, a := range n.Reads {
			readers[ka{k, a}] = append(readers[ka{k, a}], i)
		}
	}
	add := func(from, to int, kind EdgeKind, key string, age int64) {
		if from == to {
			return
		}
		g.out[from] = append(g.out[from], len(g.edges))
		g.edges = append(g.edges, graphEdge{from, to, kind, key, age})
	}
	// Deterministic order, so reports are stable.
	keys := slices.SortedFunc(maps.Keys(writers), func(x, y ka) int {
		if x.key != y.key {
			if x.key < y.key {
				return -1
			}
			return 1
		}
		return int(x.age - y.age)
	})
	for _, v := range keys {
		ws := writers[v]
		if len(ws) > 1 {
			g.dups = append(g.dups, dupVersion{v.key, v.age, ws})
		}
		for _, w := range ws {
			for _, p := range writers[ka{v.key, v.age - 1}] {
				add(p, w, EdgeWW, v.key, v.age)
			}
			for _, r := range readers[v] {
				add(w, r, EdgeWR, v.key, v.age)
			}
			for _, r := range readers[ka{v.key, v.age - 1}] {
				add(r, w, EdgeRW, v.key, v.age)
			}
		}
	}
	return g
}

// cycles returns one cycle from every strongly connected component of more
// than one node that holds a focus node (Tarjan's algorithm, iterative,
// O(V+E)).
func (g *Graph) cycles() [][]graphEdge {
	n := len(g.nodes)
	index := make([]int, n)
	low := make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	comp := make([]int, n)
	var comps [][]int
	next := 0
	type frame struct{ v, ei int }
	for root := range n {
		if index[root] >= 0 {
			continue
		}
		call := []frame{{root, 0}}
		index[root], low[root] = next, next
		next++
		stack = append(stack, root)
		onStack[root] = true
		for len(call) > 0 {
			f := &call[len(call)-1]
			if f.ei < len(g.out[f.v]) {
				w := g.edges[g.out[f.v][f.ei]].to
				f.ei++
				if index[w] < 0 {
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					call = append(call, frame{w, 0})
				} else if onStack[w] && index[w] < low[f.v] {
					low[f.v] = index[w]
				}
				continue
			}
			v := f.v
			call = call[:len(call)-1]
			if len(call) > 0 {
				if p := call[len(call)-1].v; low[v] < low[p] {
					low[p] = low[v]
				}
			}
			if low[v] == index[v] {
				var c []int
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					onStack[w] = false
					comp[w] = len(comps)
					c = append(c, w)
					if w == v {
						break
					}
				}
				comps = append(comps, c)
			}
		}
	}
	var out [][]graphEdge
	for ci, c := range comps {
		if len(c) < 2 || !slices.ContainsFunc(c, func(i int) bool { return g.nodes[i].Focus }) {
			continue
		}
		start := slices.Min(c)
		out = append(out, g.cycleThrough(start, comp, ci))
	}
	return out
}

// cycleThrough finds a shortest cycle through start inside component ci
// by breadth-first search.
func (g *Graph) cycleThrough(start int, comp []int, ci int) []graphEdge {
	via := map[int]int{} // node → the edge that reached it
	queue := []int{start}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, ei := range g.out[v] {
			e := g.edges[ei]
			if comp[e.to] != ci {
				continue
			}
			if e.to == start {
				path := []graphEdge{e}
				for u := v; u != start; u = g.edges[via[u]].from {
					path = append(path, g.edges[via[u]])
				}
				slices.Reverse(path)
				return path
			}
			if _, seen := via[e.to]; !seen {
				via[e.to] = ei
				queue = append(queue, e.to)
			}
		}
	}
	panic("mvsg: a strongly connected component without a cycle")
}

// realTimeViolations returns the edges From → To where To really finished
// before From began (end(To) < begin(From)): the dependency says From comes
// first, real time says the opposite. At least one end must be a focus
// node.
func (g *Graph) realTimeViolations() []graphEdge {
	var out []graphEdge
	for _, e := range g.edges {
		f, t := g.nodes[e.from], g.nodes[e.to]
		if (f.Focus || t.Focus) && t.End < f.Begin {
			out = append(out, e)
		}
	}
	return out
}

func (g *Graph) edge(e graphEdge) Edge {
	return Edge{From: g.nodes[e.from].ID, To: g.nodes[e.to].ID, Kind: e.kind, Key: e.key, Age: e.age}
}
