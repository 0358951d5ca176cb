package ledger

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"testing"
)

// memSource is an AssetSource kept apart from the ledger: a second
// domain's replica of the versions it saw.
type memSource struct {
	versions map[string][]*Version // id → versions by age
}

func (m *memSource) Head(_ context.Context, id string) (Head, error) {
	vs := m.versions[id]
	if len(vs) == 0 {
		return Head{Age: -1}, nil
	}
	v := vs[len(vs)-1]
	return Head{Age: v.Age, Hash: v.Hash, Output: v.Output}, nil
}

func (m *memSource) Versions(_ context.Context, id string, head int64, r ScanRange) ([]AssetValue, error) {
	end := r.End
	if end < 0 || end > head {
		end = head
	}
	var out []AssetValue
	for i := int64(0); r.Start+i <= end && len(out) < r.Limit; i++ {
		age := r.Start + i
		if !r.Ascending {
			age = end - i
		}
		out = append(out, AssetValue{Age: age, Value: m.versions[id][age].Output})
	}
	return out, nil
}

// TestRunContractMatchesExecute: running a request on a replica that holds
// the ledger's versions gives what Execute committed — the result, the
// ages read, and versions whose hashes the ledger's proofs name — so a
// second domain can order and check a request with RunContract and
// NewVersions.
func TestRunContractMatchesExecute(t *testing.T) {
	f := newFixture(t, openEngine(t))
	ctx := context.Background()
	const src = `
def invoke(ledger, args):
    a = ledger.get(args["a"])
    n = 0 if a == None else a["value"]["n"]
    hist = ledger.scan(args["a"], ascending=False, limit=3)
    ledger.put(args["a"], {"n": n + 1, "seen": len(hist)})
    ledger.put(args["b"], {"from": args["a"], "n": n})
    return {"n": n + 1}
`
	if err := f.register(f.ecdsa, "step", src); err != nil {
		t.Fatal(err)
	}
	load := func(id string) (Contract, error) { return f.l.contract(ctx, id) }
	replica := &memSource{versions: map[string][]*Version{}}
	for i := range 6 {
		req := f.request(f.ecdsa, "step", fmt.Sprintf(`{"a":"x%d","b":"y"}`, i%2))
		if err := f.l.VerifyRequest(ctx, req); err != nil {
			t.Fatal(err)
		}
		run, err := RunContract(ctx, f.l.lim, load, replica, req.ContractID, req.Argument)
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.l.Execute(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(run.Result, res.Result) || !maps.Equal(run.Input, res.Input) {
			t.Fatalf("request %d: run gave %s reading %v; the ledger %s reading %v", i, run.Result, run.Input, res.Result, res.Input)
		}
		vs := NewVersions(req, run)
		if len(vs) != len(res.Proofs) {
			t.Fatalf("request %d: %d versions, %d proofs", i, len(vs), len(res.Proofs))
		}
		for j, v := range vs {
			p := res.Proofs[j]
			if v.ID != p.ID || v.Age != p.Age || !bytes.Equal(v.Hash, p.Hash) {
				t.Fatalf("request %d: version %s@%d %x, proof %s@%d %x", i, v.ID, v.Age, v.Hash, p.ID, p.Age, p.Hash)
			}
			replica.versions[v.ID] = append(replica.versions[v.ID], v)
		}
	}
	// A replica that missed a version runs the request on a stale head:
	// its versions' hashes differ from what the ledger commits.
	stale := &memSource{versions: maps.Clone(replica.versions)}
	stale.versions["y"] = stale.versions["y"][:len(stale.versions["y"])-1]
	req := f.request(f.ecdsa, "step", `{"a":"x0","b":"y"}`)
	run, err := RunContract(ctx, f.l.lim, load, stale, req.ContractID, req.Argument)
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.l.Execute(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range NewVersions(req, run) {
		if p := res.Proofs[i]; v.ID == "y" && (v.Age == p.Age || bytes.Equal(v.Hash, p.Hash)) {
			t.Fatalf("a replica that missed y's latest version predicts the ledger's y@%d", p.Age)
		}
	}
}
