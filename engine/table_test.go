package engine

import (
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// TestPartitionHashChain: partitions whose keys hash alike share one map
// slot and are told apart by key; a scan over the table sees each once.
func TestPartitionHashChain(t *testing.T) {
	tb := newTable(1, &storage.Table{Namespace: "n", Name: "t",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}}})
	sh := &tb.parts[7]
	const h = 42 // one hash for all three keys
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		sh.insertLocked(h, &partition{t: tb, pk: k})
	}
	for _, k := range keys {
		if p := sh.find(h, k); p == nil || p.pk != k {
			t.Fatalf("find %q among colliding keys: %+v", k, p)
		}
	}
	if p := sh.find(h, "d"); p != nil {
		t.Fatalf("find of an absent key with a colliding hash: %+v", p)
	}
	if p := sh.find(h+1, "a"); p != nil {
		t.Fatalf("find under another hash: %+v", p)
	}
	seen := map[string]int{}
	tb.rangeParts(func(p *partition) bool { seen[p.pk]++; return true })
	if len(seen) != 3 || seen["a"] != 1 || seen["b"] != 1 || seen["c"] != 1 {
		t.Fatalf("rangeParts saw %v", seen)
	}
}
