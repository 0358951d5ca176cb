package proof_test

import (
	"encoding/json"
	"testing"

	"github.com/kiroku-db/kiroku/proof"
)

// TestAgeMapJSON checks the input encoding against encoding/json, whose
// output it replaces byte for byte, on ids with characters it escapes.
func TestAgeMapJSON(t *testing.T) {
	for _, m := range []map[string]int64{
		nil, {}, {"a": 0},
		{"z": -1, "a\"b": 9007199254740991, "x<y>&": 3, "back\\slash": 7, "~": 1, "9": 2, "b": 4, "c": 5, "d": 6, "e": 8},
		{"tab\there": 1}, {"\u00e9": 2},
	} {
		want, _ := json.Marshal(m)
		if m == nil {
			want = []byte("{}")
		}
		if got := proof.AppendAgeMapJSON(nil, m); string(got) != string(want) {
			t.Errorf("AppendAgeMapJSON(%v) = %s, want %s", m, got, want)
		}
	}
}

// TestAppendJSONString: the same bytes as encoding/json, appended to what
// is there, for printable ASCII with escapes and for what takes the slow
// path (control characters, invalid UTF-8, U+2028).
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "acct-1", `a"b\c`, "<&>", "~ !", "tab\t", "\x00", "\xff", "\u2028", "é"} {
		want, _ := json.Marshal(s)
		if got := proof.AppendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("AppendJSONString(%q) = %s, want x%s", s, got, want)
		}
	}
}
