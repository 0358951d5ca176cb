package coordinator

import (
	"testing"

	"github.com/google/uuid"
)

// TestTxSet: the set remembers the latest maxTxSet ids it was given at
// least, forgets older ones in one generation, and keeps no id that is
// not a UUID.
func TestTxSet(t *testing.T) {
	var s txSet
	ids := make([]string, 3*maxTxSet)
	for i := range ids {
		ids[i] = uuid.NewString()
		s.add(ids[i])
	}
	for _, id := range ids[len(ids)-maxTxSet:] {
		if !s.has(id) {
			t.Fatalf("a recent id is forgotten")
		}
	}
	if s.has(ids[0]) {
		t.Fatalf("the oldest id is still remembered")
	}
	if len(s.cur)+len(s.old) > 2*maxTxSet {
		t.Fatalf("the set holds %d ids, more than %d", len(s.cur)+len(s.old), 2*maxTxSet)
	}
	s.add("not-a-uuid")
	if s.has("not-a-uuid") {
		t.Fatalf("an id that is not a UUID is remembered")
	}
}
