package validator

import (
	"maps"
	"slices"
)

// The multi-version serialization graph (MVSG). This file is a pure core:
// no storage, no clock, no goroutines; validate.go feeds it what it loaded.

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

// gnode is one committed transaction as the graph sees it.
type gnode struct {
	nonce      string
	begin, end int64
	reads      map[string]int64 // id → age read (-1: read absent)
	writes     map[string]int64 // id → age written
	focus      bool             // being validated now (not only context)
}

// graph is the MVSG over a set of transactions.
type graph struct {
	nodes []*gnode
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

// buildGraph adds, for every version (key, a): ww from the writers of a−1
// to the writers of a; wr from the writers of a to its readers; rw from the
// readers of a−1 to the writers of a. A transaction is never linked to
// itself. Edges are O(accesses) except where a version has several writers
// or a version both many readers and several successors.
func buildGraph(nodes []*gnode) *graph {
	g := &graph{nodes: nodes, out: make([][]int, len(nodes))}
	type ka struct {
		key string
		age int64
	}
	writers := map[ka][]int{}
	readers := map[ka][]int{}
	for i, n := range nodes {
		for k, a := range n.writes {
			writers[ka{k, a}] = append(writers[ka{k, a}], i)
		}
		for k, a := range n.reads {
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
func (g *graph) cycles() [][]graphEdge {
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
		if len(c) < 2 || !slices.ContainsFunc(c, func(i int) bool { return g.nodes[i].focus }) {
			continue
		}
		start := slices.Min(c)
		out = append(out, g.cycleThrough(start, comp, ci))
	}
	return out
}

// cycleThrough finds a shortest cycle through start inside component ci
// by breadth-first search.
func (g *graph) cycleThrough(start int, comp []int, ci int) []graphEdge {
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
	panic("validator: a strongly connected component without a cycle")
}

// realTimeViolations returns the edges From → To where To really finished
// before From began (end(To) < begin(From)): the dependency says From comes
// first, real time says the opposite. At least one end must be a focus
// node.
func (g *graph) realTimeViolations() []graphEdge {
	var out []graphEdge
	for _, e := range g.edges {
		f, t := g.nodes[e.from], g.nodes[e.to]
		if (f.focus || t.focus) && t.end < f.begin {
			out = append(out, e)
		}
	}
	return out
}

func (g *graph) edge(e graphEdge) Edge {
	return Edge{From: g.nodes[e.from].nonce, To: g.nodes[e.to].nonce, Kind: e.kind, Key: e.key, Age: e.age}
}
