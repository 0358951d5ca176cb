package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// TestCheckText: texts without a canonical form are refused, each for its
// own reason and at its place.
func TestCheckText(t *testing.T) {
	deep := func(n int, inner string) string { return strings.Repeat("[", n) + inner + strings.Repeat("]", n) }
	for _, c := range []struct {
		in      string
		problem textProblem // problemOther: accepted
		offset  int
	}{
		{`{"a":[1,-2.5e3,"x\u00e9\n",true,false,null,{}]}`, problemOther, 0},
		{" \t\n\r[ 1 , { \"a\" : 2 } ] \n", problemOther, 0},
		{`"\ud83d\ude00"`, problemOther, 0},
		{`"\uD83D\uDE00"`, problemOther, 0},
		{"\"é😀\u2028\"", problemOther, 0},
		{deep(65, ""), problemOther, 0},
		{deep(64, "1"), problemOther, 0},
		{`9007199254740991`, problemOther, 0},
		{`-9007199254740991`, problemOther, 0},
		{`1e400`, problemOther, 0}, // a number: Canonical's transform refuses it
		{"\"a\xffb\"", problemUTF8, 2},
		{"\"\xed\xa0\x80\"", problemUTF8, 1},
		{"\"\xc3\"", problemUTF8, 1},
		{"{\"\xc0\xaf\":1}", problemUTF8, 2},
		{`"\ud800"`, problemSurrogate, 1},
		{`"x\ud800\u0041"`, problemSurrogate, 2},
		{`"\udc00"`, problemSurrogate, 1},
		{`"\udbff\udbff"`, problemSurrogate, 1},
		{`["\ud800`, problemSurrogate, 2},
		{deep(65, "1"), problemDepth, 64},
		{deep(66, ""), problemDepth, 64},
		{deep(20_000, ""), problemDepth, 64},
		{strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65), problemDepth, 64 * 5},
		{`9007199254740992`, problemNumber, 0},
		{`[1,-9007199254740992]`, problemNumber, 3},
		{`1000000000000000000000`, problemNumber, 0},
		{``, problemSyntax, 0},
		{` `, problemSyntax, 1},
		{`[1,]`, problemSyntax, 3},
		{`{"a"}`, problemSyntax, 4},
		{`{"a":1,}`, problemSyntax, 7},
		{`{1:1}`, problemSyntax, 1},
		{`[1 2]`, problemSyntax, 3},
		{`01`, problemSyntax, 1},
		{`1.`, problemSyntax, 2},
		{`.5`, problemSyntax, 0},
		{`1e`, problemSyntax, 2},
		{`-`, problemSyntax, 1},
		{`+1`, problemSyntax, 0},
		{`tru`, problemSyntax, 0},
		{`nulls`, problemSyntax, 4},
		{`"\x"`, problemSyntax, 1},
		{`"\u12"`, problemSyntax, 1},
		{"\"a\tb\"", problemSyntax, 2},
		{`"abc`, problemSyntax, 0},
		{`{"a":1}{}`, problemSyntax, 7},
		{"\ufeff1", problemSyntax, 0},
		{`[`, problemSyntax, 1},
	} {
		err := checkText([]byte(c.in))
		switch {
		case c.problem == problemOther && err != nil:
			t.Errorf("checkText(%.40q) = %v, want it accepted", c.in, err)
		case c.problem != problemOther && (err == nil || err.problem != c.problem || err.Offset != c.offset):
			t.Errorf("checkText(%.40q) = %+v, want problem %d at %d", c.in, err, c.problem, c.offset)
		}
	}
}

// TestJSONErrors: Canonical's refusals are *JSONError wrapping the
// sentinel named, and the depth limit is named as such.
func TestJSONErrors(t *testing.T) {
	for _, in := range []string{"\"\xff\"", `"\ud800"`, strings.Repeat("[", 20_000), `{"a":1,"a":2}`, `1e400`, `x`} {
		for _, what := range []error{ErrBadArgument, ErrBadValue} {
			_, err := Canonical([]byte(in), what)
			var je *JSONError
			if !errors.As(err, &je) || !errors.Is(err, what) || Kind(err) == "" {
				t.Errorf("Canonical(%.20q, %v) = %v, want a *JSONError wrapping it", in, what, err)
			}
		}
	}
	_, err := Canonical([]byte(strings.Repeat("[", 20_000)), ErrBadArgument)
	if want := "argument is not valid JSON: nesting exceeds the depth limit of 64 at byte 64"; err == nil || err.Error() != want {
		t.Errorf("a text 20,000 deep: %v, want %q", err, want)
	}
	if _, err := decodeJSON([]byte(strings.Repeat("[", 20_000))); err == nil || !strings.Contains(err.Error(), "depth limit of 64") {
		t.Errorf("decodeJSON of a text 20,000 deep: %v, want the depth limit named", err)
	}
}

// maxNesting is how deeply b's arrays and objects nest, strings skipped:
// a reference for checkText's depth.
func maxNesting(b []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}

// FuzzJSONText checks checkText against references, and the two ways the
// ledger reads JSON against each other. checkText accepts only what
// encoding/json calls valid, with valid UTF-8 and the depth limit kept;
// each refusal has its reason (a syntax error encoding/json sees too,
// invalid UTF-8, a surrogate the RFC 8785 transform refuses, nesting past
// 64, an integer outside ±(2^53−1)); and a valid text in bounds whose
// transform succeeds is accepted. Every refusal's message can be stored
// as a transaction's reason (valid UTF-8, no NUL). decodeJSON, which reads
// arguments and values into Starlark, accepts exactly what Canonical
// accepts, and encodes back to the same canonical form.
func FuzzJSONText(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}],"c":"\u00e9"}`, `[1.5e300,-0,true]`, `{"a":1,"a":2}`, `"\ud800"`,
		`"\ud83d\ude00"`, "\"a\xffb\"", "\"\xed\xa0\x80\"", `123456789012345678`, `1000000000000000000000`, `1e16`, `9007199254740993.0`,
		`-0.0`, `1E400`, `"\u0000\"\\\/\b\f\n\r\t"`, "\"\x00\"", `{"b":0,"\u0061":1}`, `[1,]`, `"\x"`, " [ 1 ] ",
		strings.Repeat("[", 65) + strings.Repeat("]", 65), strings.Repeat("[", 65) + "1" + strings.Repeat("]", 65),
		strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkText(b)
		if err != nil {
			if msg := err.Error(); !utf8.ValidString(msg) || strings.ContainsRune(msg, 0) {
				t.Fatalf("%q: the message %q cannot be stored as a reason", b, msg)
			}
		}
		valid, nesting := json.Valid(b), maxNesting(b)
		switch {
		case err == nil && (!valid || !utf8.Valid(b) || nesting > maxJSONDepth+1):
			t.Fatalf("checkText accepted %q: encoding/json valid %v, UTF-8 %v, nesting %d", b, valid, utf8.Valid(b), nesting)
		case err == nil:
		case err.problem == problemSyntax && valid:
			t.Fatalf("checkText calls %q a syntax error (%v); encoding/json takes it", b, err)
		case err.problem == problemUTF8 && utf8.Valid(b):
			t.Fatalf("checkText calls %q invalid UTF-8 (%v)", b, err)
		case err.problem == problemDepth && nesting <= maxJSONDepth:
			t.Fatalf("checkText calls %q too deep (%v); it nests %d", b, err, nesting)
		case err.problem == problemSurrogate:
			if _, terr := jcs.Transform(b); terr == nil {
				t.Fatalf("checkText refuses %q for a surrogate (%v); the transform takes it", b, err)
			}
		}
		if valid && utf8.Valid(b) && nesting <= maxJSONDepth && err != nil && err.problem != problemNumber {
			if _, terr := jcs.Transform(b); terr == nil {
				t.Fatalf("checkText refuses %q (%v), which is valid, in bounds and canonicalizes", b, err)
			}
		}

		canon, cerr := Canonical(b, ErrBadValue)
		v, derr := decodeJSON(b)
		if cerr != nil {
			var je *JSONError
			if !errors.As(cerr, &je) || !errors.Is(cerr, ErrBadValue) {
				t.Fatalf("Canonical refused %q with %T %v, want a *JSONError wrapping ErrBadValue", b, cerr, cerr)
			}
			if msg := cerr.Error(); !utf8.ValidString(msg) || strings.ContainsRune(msg, 0) {
				t.Fatalf("%q: the message %q cannot be stored as a reason", b, msg)
			}
		}
		if (cerr == nil) != (derr == nil) {
			t.Fatalf("%q: Canonical says %v, decodeJSON %v", b, cerr, derr)
		}
		if cerr != nil {
			return
		}
		ref, err2 := canonicalOf(v, ErrBadValue)
		if err2 != nil || !bytes.Equal(ref, canon) {
			t.Fatalf("%q: canonical %s, decoded and encoded %s (%v)", b, canon, ref, err2)
		}
	})
}
