package engine

import "testing"

// TestSpansStayBounded appends more spans than are kept and checks that
// truncation never cuts past what a checkpoint covers.
func TestSpansStayBounded(t *testing.T) {
	lg := &logger{}
	for i := uint64(1); i <= 3*maxSpans; i++ {
		lg.addSpan(logSpan{last: 10 * i, maxEpoch: i})
		lg.addSpan(logSpan{last: 10*i + 5, maxEpoch: i}) // same epoch: replaces
	}
	if len(lg.spans) > maxSpans {
		t.Fatalf("%d spans kept", len(lg.spans))
	}
	for i, sp := range lg.spans {
		if sp.last != 10*sp.maxEpoch+5 || (i > 0 && sp.maxEpoch <= lg.spans[i-1].maxEpoch) {
			t.Fatalf("span %d: %+v after %+v", i, sp, lg.spans[max(0, i-1)])
		}
	}
}
