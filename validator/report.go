package validator

import (
	"fmt"
	"io"
	"strings"

	"github.com/kiroku-db/kiroku/mvsg"
)

// Edge is a dependency between two transactions in the multi-version
// serialization graph (package mvsg).
type Edge = mvsg.Edge

// EdgeKind names a dependency: EdgeWR, EdgeWW or EdgeRW.
type EdgeKind = mvsg.EdgeKind

// The dependencies of the graph (see package mvsg).
const (
	EdgeWR = mvsg.EdgeWR
	EdgeWW = mvsg.EdgeWW
	EdgeRW = mvsg.EdgeRW
)

// Kind classifies a violation.
type Kind string

const (
	// KindIODivergence: re-executing the logged request on the Validator's
	// own states gives another result, another output, another hash or
	// another chain than the ledger committed or stores.
	KindIODivergence Kind = "io_divergence"
	// KindBadSignature: a proof or receipt does not verify under the
	// ledger's key, or does not match the transaction it came with.
	KindBadSignature Kind = "bad_proof_signature"
	// KindCycle: committed transactions form a cycle in the MVSG; no
	// serial order explains them.
	KindCycle = Kind(mvsg.Cycle)
	// KindStaleRead: a transaction read a version that another had
	// replaced and finished replacing before the reader began.
	KindStaleRead = Kind(mvsg.StaleRead)
	// KindFutureRead: a transaction read a version written by one that
	// began only after the reader had finished.
	KindFutureRead = Kind(mvsg.FutureRead)
	// KindVersionOrder: a version follows another whose writer began only
	// after the later version's writer had finished.
	KindVersionOrder = Kind(mvsg.VersionOrder)
	// KindDuplicateVersion: two committed transactions wrote the same
	// version of an asset.
	KindDuplicateVersion = Kind(mvsg.DuplicateVersion)
	// KindDropped: the ledger's history lacks a version a logged,
	// committed transaction wrote.
	KindDropped Kind = "dropped_transaction"
	// KindReordered: the ledger's history holds a logged version at
	// another age than the one its proof gave.
	KindReordered Kind = "reordered_versions"
	// KindReplay: the ledger's history holds more versions written under a
	// logged nonce than the transaction's receipt: a request executed
	// twice.
	KindReplay Kind = "replayed_request"
	// KindUnlogged: the ledger's history holds a version no logged
	// committed transaction wrote (a transaction the Validator saw abort,
	// or never saw).
	KindUnlogged Kind = "unlogged_version"
)

// Violation is one fault validation found.
type Violation struct {
	Kind   Kind     `json:"kind"`
	Txs    []string `json:"transactions"` // nonces involved
	Key    string   `json:"key,omitempty"`
	Age    int64    `json:"age,omitempty"`
	Edges  []Edge   `json:"edges,omitempty"` // a cycle, or the offending dependency
	Detail string   `json:"detail"`
}

func (v *Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", v.Kind)
	if v.Key != "" {
		fmt.Fprintf(&b, " on %s@%d", v.Key, v.Age)
	}
	fmt.Fprintf(&b, ": %s", v.Detail)
	if len(v.Txs) > 0 {
		fmt.Fprintf(&b, " [tx %s]", strings.Join(v.Txs, ", "))
	}
	for _, e := range v.Edges {
		fmt.Fprintf(&b, "\n      %s -%s(%s@%d)-> %s", e.From, e.Kind, e.Key, e.Age, e.To)
	}
	return b.String()
}

// Report is what one validation run found.
type Report struct {
	Recovery Recovery `json:"recovery"`
	// Validated counts the transactions this run covered: committed ones
	// checked, aborted ones retired.
	Validated int `json:"validated"`
	Committed int `json:"committed"`
	Aborted   int `json:"aborted"`
	// Waiting counts the pending transactions left for a later run because
	// an unresolved transaction began before they ended.
	Waiting    int `json:"waiting"`
	Unresolved int `json:"unresolved"`
	// Graph sizes: the transactions the MVSG held (the new ones, older
	// ones they overlap, and neighbours through shared versions) and its
	// edges.
	GraphNodes int `json:"graph_nodes"`
	GraphEdges int `json:"graph_edges"`
	// CrossChecked counts the asset versions compared with the ledger's
	// history, CrossCheckedKeys the assets.
	CrossChecked     int `json:"cross_checked"`
	CrossCheckedKeys int `json:"cross_checked_keys"`
	// Scope says which assets were cross-checked and which were not.
	Scope      string      `json:"scope"`
	Violations []Violation `json:"violations"`
	// Seconds spent per phase.
	Seconds Timings `json:"seconds"`
}

// Timings are the wall-clock seconds of a run's phases.
type Timings struct {
	Recover    float64 `json:"recover"`
	Load       float64 `json:"load"` // reading the pending log
	Signatures float64 `json:"signatures"`
	IO         float64 `json:"io"` // re-execution
	Graph      float64 `json:"graph"`
	Persist    float64 `json:"persist"`
	CrossCheck float64 `json:"cross_check"`
	Total      float64 `json:"total"`
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// Print writes a human summary.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "validated %d transactions new to this run (%d committed, %d aborted); graph %d nodes, %d edges\n",
		r.Validated, r.Committed, r.Aborted, r.GraphNodes, r.GraphEdges)
	fmt.Fprintf(w, "%s: %d assets, %d versions\n", r.Scope, r.CrossCheckedKeys, r.CrossChecked)
	if rc := r.Recovery; rc != (Recovery{}) {
		fmt.Fprintf(w, "recovered in-doubt transactions: %d committed, %d aborted, %d timed out, %d still unknown\n",
			rc.Committed, rc.Aborted, rc.TimedOut, rc.Unresolved)
	}
	if r.Waiting > 0 || r.Unresolved > 0 {
		fmt.Fprintf(w, "%d transactions wait for %d unresolved ones\n", r.Waiting, r.Unresolved)
	}
	if r.OK() {
		fmt.Fprintln(w, "no violations")
		return
	}
	fmt.Fprintf(w, "%d VIOLATIONS\n", len(r.Violations))
	for i := range r.Violations {
		fmt.Fprintf(w, "  %s\n", r.Violations[i].String())
	}
}
