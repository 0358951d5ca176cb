package ledger

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// TestHistoryByteBudget writes versions whose encodings are about 2 KB
// (a 900-byte value and an argument as long), and one of about 6 KB, and
// reads them back under a 5,000-byte reply budget: every page stays within the budget (or holds
// a single version), says it was cut exactly when versions of its range
// and limit remain, and pages taken from after each last version give
// back every version once, in order, both ways.
func TestHistoryByteBudget(t *testing.T) {
	backends(t, func(t *testing.T, b storage.Backend) {
		ctx := context.Background()
		const budget, versions = 5000, 9
		f := newFixtureLimits(t, b, Limits{MaxSteps: 100_000, MaxValueBytes: 4096, MaxArgumentBytes: 4096, MaxWrites: 1000,
			MaxReplyBytes: budget})
		if err := f.register(f.hmac, "fill", `
def invoke(ledger, args):
    ledger.put(args["id"], {"fill": args["fill"]})
    return None
`); err != nil {
			t.Fatal(err)
		}
		for i := range versions {
			n := 900
			if i == 4 {
				n = 3000 // about 6 KB encoded: alone over the budget, yet returned
			}
			f.mustExec(f.hmac, "fill", fmt.Sprintf(`{"id":"big","fill":%q}`, strings.Repeat(string(rune('a'+i)), n)))
		}
		// The whole history, unbounded by bytes, to compare with.
		var all []*Version
		for i := range versions {
			v, err := f.l.Version(ctx, "big", int64(i))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, v)
		}
		cuts, pairs := 0, 0
		for _, asc := range []bool{true, false} {
			for _, limit := range []int{0, 1, 2, 4, 100} {
				r := ScanRange{End: -1, Ascending: asc, Limit: limit}
				want := min(versions, limit)
				if limit == 0 {
					want = versions
				}
				var got []*Version
				for calls := 0; ; calls++ {
					if calls > versions {
						t.Fatalf("asc=%v limit=%d: more pages than versions", asc, limit)
					}
					page, err := f.l.History(ctx, "big", r)
					if err != nil {
						t.Fatal(err)
					}
					size := 0
					for _, v := range page.Versions {
						size += EncodedBound(v)
					}
					if len(page.Versions) == 0 || size > budget && len(page.Versions) > 1 {
						t.Fatalf("asc=%v limit=%d: a page of %d versions, %d bytes", asc, limit, len(page.Versions), size)
					}
					got = append(got, page.Versions...)
					if page.Truncated {
						cuts++
					}
					if len(page.Versions) > 1 {
						pairs++
					}
					remaining := want - len(got)
					if page.Truncated != (remaining > 0 && len(page.Versions) < page.Limit) {
						t.Fatalf("asc=%v limit=%d: page %d truncated=%v with %d of %d versions to go (page limit %d)",
							asc, limit, calls, page.Truncated, remaining, want, page.Limit)
					}
					if !page.Truncated {
						break
					}
					last := page.Versions[len(page.Versions)-1].Age
					if asc {
						r.Start = last + 1
					} else {
						r.End = last - 1
					}
					r.Limit = page.Limit - len(page.Versions)
				}
				if len(got) != want {
					t.Fatalf("asc=%v limit=%d: %d versions, want %d", asc, limit, len(got), want)
				}
				for i, v := range got {
					w := all[i]
					if !asc {
						w = all[versions-1-i]
					}
					if v.Age != w.Age || string(v.Hash) != string(w.Hash) || string(v.Output) != string(w.Output) {
						t.Fatalf("asc=%v limit=%d: version %d is age %d, want %d", asc, limit, i, v.Age, w.Age)
					}
				}
			}
		}
		if cuts == 0 || pairs == 0 {
			t.Fatalf("%d pages cut short, %d with more than one version: the budget did not shape the pages", cuts, pairs)
		}
	})
}
