package ledger

import (
	"bytes"
	"errors"
	"strings"
	"testing"
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
	for _, s := range []string{`{"a":[1,2,{"b":null}],"c":"\u00e9"}`, `[1.5e300,-0,true]`, `{"a":1,"a":2}`, `"\ud800"`, `123456789012345678`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
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
