package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

func TestCanonical(t *testing.T) {
	deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
	tooDeep := strings.Repeat("[", 66) + "1" + strings.Repeat("]", 66)
	cases := []struct{ in, want string }{
		{`{"b": [1, 2.50, "x"], "a": {"z": null, "y": true}}`, `{"a":{"y":true,"z":null},"b":[1,2.5,"x"]}`},
		{`"\u00e9\u0041"`, `"éA"`},
		{`9007199254740991`, `9007199254740991`},
		{`-9007199254740991`, `-9007199254740991`},
		{`1e21`, `1e+21`},
		{`{"a":{"a":1},"b":{"a":2}}`, `{"a":{"a":1},"b":{"a":2}}`},
		{deep, deep},
		{`{"a":1,"a":2}`, ""},
		{`{"b":0,"\u0061":1,"a":2}`, ""},
		{`{"x":{"k":1,"k":1}}`, ""},
		{`9007199254740992`, ""},
		{`-9007199254740993`, ""},
		{`1e400`, ""},
		{`{"a":1}x`, ""},
		{`{"a":1} {}`, ""},
		{`'a'`, ""},
		{``, ""},
		{tooDeep, ""},
	}
	for _, c := range cases {
		got, err := Canonical([]byte(c.in), ErrBadArgument)
		if c.want == "" {
			if err == nil || !errors.Is(err, ErrBadArgument) {
				t.Errorf("Canonical(%.40s) = %s, %v; want ErrBadArgument", c.in, got, err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("Canonical(%.40s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

// FuzzCanonical checks Canonical against the decoding path contracts use:
// whatever it accepts decodes, re-canonicalises to itself, and matches the
// canonical form of the decoded value.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}],"c":"\u00e9"}`, `[1.5e300,-0,true]`, `{"a":1,"a":2}`, `"\ud800"`, `123456789012345678`, `{"id":"a1","payload":"x"}`, `{"a":[1,-2,{}],"b":null}`, `{"a!":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if isCanonical(b) {
			slow, err := jcs.Transform(b)
			if err != nil || !bytes.Equal(slow, b) || checkCanonical(slow) != nil || !json.Valid(b) {
				t.Fatalf("%q takes the fast path, but the transform gives %q, %v", b, slow, err)
			}
		}
		out, err := Canonical(b, ErrBadArgument)
		if err != nil {
			return
		}
		again, err := Canonical(out, ErrBadArgument)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("canonical form %s is not a fixpoint: %s %v", out, again, err)
		}
		v, err := decodeJSON(out)
		if err != nil {
			t.Fatalf("accepted %q (canonical %s) but the decoder refuses it: %v", b, out, err)
		}
		ref, err := canonicalOf(v, ErrBadArgument)
		if err != nil || !bytes.Equal(ref, out) {
			t.Fatalf("%q: canonical %s, via decoding %s (%v)", b, out, ref, err)
		}
	})
}

// TestCanonicalFastPath checks which texts skip the transform: the shapes
// the SDK and the built-in contracts write do, anything needing a change
// or a check of the transform does not.
func TestCanonicalFastPath(t *testing.T) {
	deep := strings.Repeat("[", 64) + strings.Repeat("]", 64)
	for _, c := range []struct {
		in   string
		fast bool
	}{
		{`{"id":"a1","payload":"xyz"}`, true},
		{`{"ids":["a","b"]}`, true},
		{`{"age":12,"n":-9007199254740991,"z":[true,false,null,{},[]]}`, true},
		{`0`, true}, {`""`, true}, {deep, true},
		{"[" + deep + "]", false}, // 65 levels: the transform decides
		{`{"b":1,"a":2}`, false}, {`{"a!":1,"a":2}`, false}, {`{"a ":1,"a":2}`, false}, {`{"a":1,"a!":2}`, true}, {`{"a":1,"a":2}`, false}, {`{"a":1, "b":2}`, false},
		{`-0`, false}, {`01`, false}, {`1.5`, false}, {`1e3`, false}, {`9007199254740992`, false},
		{`"\u0041"`, false}, {`"é"`, false}, {"\"\x7f\"", false}, {`"a\"b"`, false},
		{`{"a":1}x`, false}, {`[1,]`, false}, {`{"a"}`, false}, {`tru`, false}, {``, false}, {`[`, false},
	} {
		if got := isCanonical([]byte(c.in)); got != c.fast {
			t.Errorf("isCanonical(%.50s) = %v, want %v", c.in, got, c.fast)
		}
		if !c.fast {
			continue
		}
		slow, err := jcs.Transform([]byte(c.in))
		if err != nil || string(slow) != c.in || checkCanonical(slow) != nil {
			t.Errorf("%.50s takes the fast path but the transform gives %s, %v", c.in, slow, err)
		}
	}
}

// FuzzSimpleDecode checks the built-ins' fast decoding against
// encoding/json: whatever the fast path decodes, encoding/json decodes to
// the same, and a value the fast path encodes is the canonical form of
// what encoding/json encodes.
func FuzzSimpleDecode(f *testing.F) {
	for _, s := range []string{`{"id":"a1","payload":"x"}`, `{"payload":"p<&>","updates":7}`, `{"UPDATES":5,"updates":1}`,
		`{"Updates":3}`, `{"ids":["a","b"]}`, `{"ids":[]}`, `{"ids":["a",1]}`, `{"payload":1}`, `{"updates":"x"}`, `{}`,
		`{"payload":null}`, `{"updates":-0}`, `{"updates":9007199254740991}`, `{"a":{"b":[1]},"id":"x"}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast, slow ycsbValue
		if fast.simple(b) {
			if err := json.Unmarshal(b, &slow); err != nil || fast != slow {
				t.Fatalf("value %s: fast %+v, encoding/json %+v, %v", b, fast, slow, err)
			}
			if out, ok := fast.appendSimple(nil); ok {
				m, _ := json.Marshal(fast)
				if want, err := Canonical(m, ErrBadValue); err != nil || !bytes.Equal(out, want) {
					t.Fatalf("value %+v: fast encoding %s, canonical %s (%v)", fast, out, want, err)
				}
			}
		}
		if ms, ok := simpleMembers(b, nil); ok {
			for _, m := range ms {
				var any struct {
					S  string
					N  int64
					SS []string
				}
				if v, ok := simpleString(m.raw); ok && (json.Unmarshal(m.raw, &any.S) != nil || any.S != v) {
					t.Fatalf("string %s: fast %q, encoding/json %q", m.raw, v, any.S)
				}
				if v, ok := simpleInt(m.raw); ok && (json.Unmarshal(m.raw, &any.N) != nil || any.N != v) {
					t.Fatalf("integer %s: fast %d, encoding/json %d", m.raw, v, any.N)
				}
				if v, ok := simpleStrings(m.raw); ok && (json.Unmarshal(m.raw, &any.SS) != nil || !slices.Equal(any.SS, v)) {
					t.Fatalf("strings %s: fast %q, encoding/json %q", m.raw, v, any.SS)
				}
			}
		}
	})
}
