package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
	"go.starlark.net/starlark"

	"github.com/kiroku-db/kiroku/proof"
)

// maxSafeInt is the largest integer every JSON reader holds exactly (2^53−1,
// I-JSON, RFC 7493). Canonical JSON (RFC 8785) writes numbers as IEEE
// doubles, so a larger integer would change silently on the way through;
// the ledger rejects it instead.
const maxSafeInt = 1<<53 - 1

// maxJSONDepth bounds the nesting of arguments and values.
const maxJSONDepth = 64

// Canonical checks that b is one well-formed JSON text within the ledger's
// rules and returns its RFC 8785 canonical form. The rules: strings are
// valid UTF-8 and name no lone UTF-16 surrogate in a \u escape (RFC 8785
// §3.2.2.2 requires rejecting both: neither has a canonical form, and
// replacing them with U+FFFD would store other text than the client
// signed), no value is nested in more than 64 arrays and objects, no
// duplicate object keys, and integers (numbers written with digits only,
// in the text and in its canonical form) within ±(2^53−1). A refusal is a
// *JSONError wrapping what.
//
// Most texts arrive canonical already (the SDK and the built-in contracts
// write them so); those are recognised in one pass and returned as they
// are, b itself, without the transform.
func Canonical(b []byte, what error) ([]byte, error) {
	if isCanonical(b) {
		return b, nil
	}
	if err := checkText(b); err != nil {
		err.What = what
		return nil, err
	}
	out, err := jcs.Transform(b)
	if err != nil { // checkText passed: a number no double holds, say
		return nil, &JSONError{What: what, Offset: -1, Reason: err.Error()}
	}
	if err := checkCanonical(out); err != nil {
		return nil, &JSONError{What: what, Offset: -1, Reason: err.Error()}
	}
	return out, nil
}

// A JSONError is why a JSON text was refused. It wraps What, the ledger
// sentinel its caller named (ErrBadArgument for a request's argument,
// ErrBadValue for a value or result), which is its kind on the wire and so
// its gRPC code (InvalidArgument for both).
type JSONError struct {
	What error // the sentinel; nil where the caller wraps the error itself (decodeJSON)
	// Offset is the byte of the text where the fault was found, or -1 for
	// a rule checked on the canonical form or on decoded values.
	Offset int
	Reason string
	// problem classifies the faults checkText finds, for tests.
	problem textProblem
}

func (e *JSONError) Error() string {
	s := e.Reason
	if e.Offset >= 0 {
		s = fmt.Sprintf("%s at byte %d", s, e.Offset)
	}
	if e.What != nil {
		s = e.What.Error() + ": " + s
	}
	return s
}

// Unwrap returns the sentinel.
func (e *JSONError) Unwrap() error { return e.What }

// textProblem is the class of fault checkText reports.
type textProblem uint8

const (
	problemOther     textProblem = iota // a rule checked after the text (keys, numbers)
	problemSyntax                       // not RFC 8259 JSON
	problemUTF8                         // a string that is not valid UTF-8
	problemSurrogate                    // a \u escape naming a lone surrogate
	problemDepth                        // nested past maxJSONDepth
	problemNumber                       // an integer outside ±(2^53−1)
)

// checkText checks that b is exactly one JSON text (RFC 8259) whose
// strings are valid UTF-8 without a \u escape of a lone surrogate, whose
// integers (numbers written with digits only) are within ±(2^53−1), and
// whose values are each nested in at most maxJSONDepth arrays and objects.
// It is iterative: a text's depth costs no stack. The error's What is nil.
func checkText(b []byte) *JSONError {
	fail := func(i int, p textProblem, reason string) *JSONError {
		return &JSONError{Offset: i, Reason: reason, problem: p}
	}
	syntax := func(i int) *JSONError {
		if i >= len(b) {
			return fail(len(b), problemSyntax, "not a JSON text: unexpected end")
		}
		return fail(i, problemSyntax, fmt.Sprintf("not a JSON text: unexpected %q", b[i:i+1]))
	}
	// open[d] says whether the container that holds the values of depth
	// d+1 is an object. A value at depth maxJSONDepth may be a container
	// only if it is empty, so at most maxJSONDepth are ever open.
	var open [maxJSONDepth]bool
	depth := 0
	i := skipSpace(b, 0)
	for {
		// A value starts at i, at the given depth.
		if i >= len(b) {
			return syntax(i)
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			closer := byte(']')
			if c == '{' {
				closer = '}'
			}
			j := skipSpace(b, i+1)
			if j < len(b) && b[j] == closer {
				i = j + 1
				break // an empty container is a complete value
			}
			if depth == maxJSONDepth {
				return fail(i, problemDepth, fmt.Sprintf("nesting exceeds the depth limit of %d", maxJSONDepth))
			}
			open[depth] = c == '{'
			depth++
			i = j
			if c == '{' {
				var err *JSONError
				if i, err = checkMemberName(b, i, fail, syntax); err != nil {
					return err
				}
			}
			continue
		case c == '"':
			var err *JSONError
			if i, err = checkString(b, i, fail); err != nil {
				return err
			}
		case c == '-' || (c >= '0' && c <= '9'):
			start := i
			var ok, integral bool
			if i, integral, ok = checkNumber(b, i); !ok {
				return syntax(i)
			}
			// On the text, not the canonical form: there an integer past
			// 10^21 is written with an exponent, and a wrong digit would
			// have vanished.
			if integral {
				if _, err := numberValue(json.Number(b[start:i])); err != nil {
					return fail(start, problemNumber, err.Error())
				}
			}
		case c == 't', c == 'f', c == 'n':
			w := "null"
			if c == 't' {
				w = "true"
			} else if c == 'f' {
				w = "false"
			}
			if len(b)-i < len(w) || string(b[i:i+len(w)]) != w {
				return syntax(i)
			}
			i += len(w)
		default:
			return syntax(i)
		}
		// A value ended before i: close the containers it completes, and
		// find the start of the next one.
		for {
			i = skipSpace(b, i)
			if depth == 0 {
				if i != len(b) {
					return fail(i, problemSyntax, "not a JSON text: data after the value")
				}
				return nil
			}
			if i >= len(b) {
				return syntax(i)
			}
			object := open[depth-1]
			closer := byte(']')
			if object {
				closer = '}'
			}
			if b[i] == closer {
				depth--
				i++
				continue
			}
			if b[i] != ',' {
				return syntax(i)
			}
			i = skipSpace(b, i+1)
			if object {
				var err *JSONError
				if i, err = checkMemberName(b, i, fail, syntax); err != nil {
					return err
				}
			}
			break
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// checkMemberName checks an object member's name and colon at b[i:] and
// returns the index of its value.
func checkMemberName(b []byte, i int, fail func(int, textProblem, string) *JSONError, syntax func(int) *JSONError) (int, *JSONError) {
	if i >= len(b) || b[i] != '"' {
		return i, syntax(i)
	}
	i, err := checkString(b, i, fail)
	if err != nil {
		return i, err
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, syntax(i)
	}
	return skipSpace(b, i+1), nil
}

// checkString checks the string at b[i:] (b[i] is its opening quote) and
// returns the index just past it.
func checkString(b []byte, i int, fail func(int, textProblem, string) *JSONError) (int, *JSONError) {
	start := i
	for i++; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c < 0x20:
			return i, fail(i, problemSyntax, "not a JSON text: a control character in a string")
		case c == '\\':
			if i+1 >= len(b) {
				return i, fail(i, problemSyntax, "not a JSON text: unterminated string")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
				continue
			case 'u':
			default:
				return i, fail(i, problemSyntax, fmt.Sprintf("not a JSON text: unknown escape %q", b[i:i+2]))
			}
			r, ok := hex4(b, i+2)
			if !ok {
				return i, fail(i, problemSyntax, "not a JSON text: a \\u escape needs four hex digits")
			}
			switch {
			case r >= 0xdc00 && r <= 0xdfff:
				return i, fail(i, problemSurrogate, fmt.Sprintf("\\u%04x is a lone low surrogate", r))
			case r >= 0xd800 && r <= 0xdbff:
				lo, ok := rune(0), i+8 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u'
				if ok {
					lo, ok = hex4(b, i+8)
				}
				if !ok || lo < 0xdc00 || lo > 0xdfff {
					return i, fail(i, problemSurrogate, fmt.Sprintf("\\u%04x is a high surrogate without a low one after it", r))
				}
				i += 12
			default:
				i += 6
			}
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				return i, fail(i, problemUTF8, "invalid UTF-8 in a string")
			}
			i += n
		}
	}
	return i, fail(start, problemSyntax, "not a JSON text: unterminated string")
}

// hex4 decodes the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// checkNumber checks the number at b[i:] (RFC 8259: -?(0|[1-9][0-9]*)
// (.[0-9]+)?([eE][+-]?[0-9]+)?) and returns the index just past it and
// whether it is written with digits only (an integer, to the ledger).
func checkNumber(b []byte, i int) (end int, integral, ok bool) {
	digits := func(i int) (int, bool) {
		j := i
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j, j > i
	}
	if b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if i, ok = digits(i); !ok {
		return i, false, false
	}
	integral = true
	if i < len(b) && b[i] == '.' {
		integral = false
		if i, ok = digits(i + 1); !ok {
			return i, false, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		integral = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i, ok = digits(i); !ok {
			return i, false, false
		}
	}
	return i, integral, true
}

// isCanonical reports whether b is a JSON text that Canonical would return
// unchanged and accept. It recognises a conservative subset, and false
// only means "take the transform": strings of printable ASCII without
// escapes, integers within ±(2^53−1) without a sign on zero, object keys
// in strictly increasing byte order (the order of UTF-16 code units, for
// ASCII), no whitespace, nesting at most maxJSONDepth.
func isCanonical(b []byte) bool {
	end, ok := canonicalValue(b, 0, 0)
	return ok && end == len(b)
}

// canonicalValue scans the value at b[i:] at nesting depth and returns
// the index just past it.
func canonicalValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return canonicalString(b, i)
	case c == '-' || (c >= '0' && c <= '9'):
		return canonicalInt(b, i)
	case c == '{' || c == '[':
		if depth >= maxJSONDepth {
			return i, false
		}
		closer, object := byte(']'), c == '{'
		if object {
			closer = '}'
		}
		i++
		if i < len(b) && b[i] == closer {
			return i + 1, true
		}
		var prev []byte
		for {
			if object {
				start := i
				var ok bool
				if i, ok = canonicalString(b, i); !ok || i >= len(b) || b[i] != ':' {
					return i, false
				}
				key := b[start+1 : i-1] // without the quotes: "a" sorts before "a!"
				if prev != nil && bytes.Compare(prev, key) >= 0 {
					return i, false
				}
				prev = key
				i++
			}
			var ok bool
			if i, ok = canonicalValue(b, i, depth+1); !ok || i >= len(b) {
				return i, false
			}
			switch b[i] {
			case ',':
				i++
			case closer:
				return i + 1, true
			default:
				return i, false
			}
		}
	case c == 't':
		return canonicalWord(b, i, "true")
	case c == 'f':
		return canonicalWord(b, i, "false")
	case c == 'n':
		return canonicalWord(b, i, "null")
	}
	return i, false
}

func canonicalString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return i, false
		}
	}
	return i, false
}

func canonicalInt(b []byte, i int) (int, bool) {
	start := i
	if b[i] == '-' {
		i++
	}
	digits := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	n := i - digits
	switch {
	case n == 0 || n > 16 || (n > 1 && b[digits] == '0'):
		return i, false
	case b[digits] == '0' && digits > start: // -0
		return i, false
	case i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E'):
		return i, false
	}
	var v uint64 // at most 16 digits: no overflow
	for _, d := range b[digits:i] {
		v = v*10 + uint64(d-'0')
	}
	return i, v <= maxSafeInt
}

func canonicalWord(b []byte, i int, w string) (int, bool) {
	if len(b)-i < len(w) || string(b[i:i+len(w)]) != w {
		return i, false
	}
	return i + len(w), true
}

// checkCanonical walks canonical JSON (no whitespace, members sorted, so
// duplicate keys are adjacent and equal keys have equal bytes) and applies
// the ledger's rules.
func checkCanonical(c []byte) error {
	type level struct {
		object    bool
		expectKey bool
		prevKey   []byte
	}
	var stack []level
	for i := 0; i < len(c); {
		ch := c[i]
		switch ch {
		case '{', '[':
			if len(stack) > maxJSONDepth {
				return fmt.Errorf("nesting exceeds the depth limit of %d", maxJSONDepth)
			}
			stack = append(stack, level{object: ch == '{', expectKey: ch == '{'})
			i++
			continue
		case '}', ']':
			stack = stack[:len(stack)-1]
			i++
			continue
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				top.expectKey = true
			}
			i++
			continue
		case ':':
			i++
			continue
		}
		if len(stack) > maxJSONDepth {
			return fmt.Errorf("nesting exceeds the depth limit of %d", maxJSONDepth)
		}
		switch {
		case ch == '"':
			j := i + 1
			for c[j] != '"' {
				if c[j] == '\\' {
					j++
				}
				j++
			}
			if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].expectKey {
				top := &stack[n-1]
				key := c[i : j+1]
				if top.prevKey != nil && bytes.Equal(top.prevKey, key) {
					return fmt.Errorf("duplicate object key %s", key)
				}
				top.prevKey, top.expectKey = key, false
			}
			i = j + 1
		case ch == '-' || (ch >= '0' && ch <= '9'):
			j, integral := i, true
			for j < len(c) && strings.IndexByte("0123456789-+.eE", c[j]) >= 0 {
				if c[j] == '.' || c[j] == 'e' || c[j] == 'E' {
					integral = false
				}
				j++
			}
			if integral {
				if _, err := numberValue(json.Number(c[i:j])); err != nil {
					return err
				}
			}
			i = j
		default: // true, false, null
			for i < len(c) && c[i] >= 'a' && c[i] <= 'z' {
				i++
			}
		}
	}
	return nil
}

// canonicalOf encodes a decoded value (the types decodeJSON produces) in
// RFC 8785 form.
func canonicalOf(v any, what error) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", what, err)
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", what, err)
	}
	return out, nil
}

// decodeJSON parses one JSON text into nil, bool, string, json.Number,
// []any and map[string]any under the rules Canonical applies, so that the
// two accept the same texts: it rejects invalid UTF-8, lone surrogates,
// duplicate keys, integers outside ±(2^53−1) (and integral numbers outside
// it, which canonical form writes as integers), non-finite numbers, excess
// nesting and trailing data. Its errors are *JSONError without a sentinel:
// callers wrap them in theirs.
func decodeJSON(b []byte) (any, error) {
	if err := checkText(b); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, &JSONError{Offset: -1, Reason: err.Error()}
	}
	if _, err := dec.Token(); err == nil {
		return nil, &JSONError{Offset: -1, Reason: "trailing data after the JSON value"}
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nesting exceeds the depth limit of %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				if _, dup := m[k]; dup {
					return nil, fmt.Errorf("duplicate object key %q", k)
				}
				if m[k], err = decodeValue(dec, depth+1); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token() // '}'
			return m, err
		case '[':
			l := []any{}
			for dec.More() {
				e, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, e)
			}
			_, err := dec.Token() // ']'
			return l, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if _, err := numberValue(t); err != nil {
			return nil, err
		}
		return t, nil
	default: // nil, bool, string
		return t, nil
	}
}

// numberValue returns an integral JSON number as int64 (within the safe
// range) and any other as float64.
func numberValue(n json.Number) (any, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil || i > maxSafeInt || i < -maxSafeInt {
			return nil, fmt.Errorf("integer %s outside ±(2^53−1)", s)
		}
		return i, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, fmt.Errorf("number %s is not a finite double", s)
	}
	if err := checkFloat(f); err != nil {
		return nil, err
	}
	return f, nil
}

// checkFloat rejects a finite double whose canonical form (RFC 8785: the
// ECMAScript number formatting, digits only for an integral magnitude
// below 10^21) is an integer outside ±(2^53−1), which the ledger refuses
// as an integer: accepted as a double, it would be stored as a text that
// no contract could read back.
func checkFloat(f float64) error {
	if a := math.Abs(f); a > maxSafeInt && a < 1e21 && a == math.Trunc(a) {
		return fmt.Errorf("number %v is integral and outside ±(2^53−1)", f)
	}
	return nil
}

// toStarlark converts a decoded JSON value into a Starlark value: objects
// become dicts (keys in canonical order), arrays lists, integers ints,
// other numbers floats.
func toStarlark(v any) (starlark.Value, error) {
	switch t := v.(type) {
	case nil:
		return starlark.None, nil
	case bool:
		return starlark.Bool(t), nil
	case string:
		return starlark.String(t), nil
	case json.Number:
		n, err := numberValue(t)
		if err != nil {
			return nil, err
		}
		if i, ok := n.(int64); ok {
			return starlark.MakeInt64(i), nil
		}
		return starlark.Float(n.(float64)), nil
	case []any:
		elems := make([]starlark.Value, len(t))
		for i, e := range t {
			sv, err := toStarlark(e)
			if err != nil {
				return nil, err
			}
			elems[i] = sv
		}
		return starlark.NewList(elems), nil
	case map[string]any:
		d := starlark.NewDict(len(t))
		// Byte order; canonical JSON re-sorts by UTF-16 code units anyway, this
		// only makes dict insertion order independent of map iteration.
		for _, k := range appendSortedKeys(nil, t) {
			sv, err := toStarlark(t[k])
			if err != nil {
				return nil, err
			}
			if err := d.SetKey(starlark.String(k), sv); err != nil {
				return nil, err
			}
		}
		return d, nil
	}
	return nil, fmt.Errorf("unexpected JSON value %T", v)
}

// fromStarlark converts a Starlark value into a JSON-able Go value. Only
// None, bools, ints within ±(2^53−1), finite floats, strings, lists, tuples
// and dicts with string keys are allowed; anything else is ErrBadValue.
func fromStarlark(v starlark.Value, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("%w: nesting exceeds the depth limit of %d", ErrBadValue, maxJSONDepth)
	}
	switch t := v.(type) {
	case starlark.NoneType:
		return nil, nil
	case starlark.Bool:
		return bool(t), nil
	case starlark.String:
		if !utf8.ValidString(string(t)) {
			return nil, fmt.Errorf("%w: string %s is not valid UTF-8", ErrBadValue, quotePrefix(string(t)))
		}
		return string(t), nil
	case starlark.Int:
		i, ok := t.Int64()
		if !ok || i > maxSafeInt || i < -maxSafeInt {
			return nil, fmt.Errorf("%w: integer %s outside ±(2^53−1)", ErrBadValue, t)
		}
		return i, nil
	case starlark.Float:
		f := float64(t)
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("%w: %v is not a finite number", ErrBadValue, f)
		}
		if err := checkFloat(f); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadValue, err)
		}
		return f, nil
	case *starlark.List:
		return seqFromStarlark(t, depth)
	case starlark.Tuple:
		return seqFromStarlark(t, depth)
	case *starlark.Dict:
		m := make(map[string]any, t.Len())
		for _, item := range t.Items() {
			k, ok := item[0].(starlark.String)
			if !ok {
				return nil, fmt.Errorf("%w: dict key %s is a %s, want string", ErrBadValue, item[0], item[0].Type())
			}
			if !utf8.ValidString(string(k)) {
				return nil, fmt.Errorf("%w: dict key %s is not valid UTF-8", ErrBadValue, quotePrefix(string(k)))
			}
			e, err := fromStarlark(item[1], depth+1)
			if err != nil {
				return nil, err
			}
			m[string(k)] = e
		}
		return m, nil
	}
	return nil, fmt.Errorf("%w: a %s", ErrBadValue, v.Type())
}

// quotePrefix quotes the first bytes of s for an error message in ASCII,
// whatever s holds: a message becomes an abort's stored reason, which must
// be valid UTF-8.
func quotePrefix(s string) string {
	if len(s) > 40 {
		return strconv.QuoteToASCII(s[:40]) + "…"
	}
	return strconv.QuoteToASCII(s)
}

func seqFromStarlark(s starlark.Indexable, depth int) (any, error) {
	out := make([]any, s.Len())
	for i := range out {
		e, err := fromStarlark(s.Index(i), depth+1)
		if err != nil {
			return nil, err
		}
		out[i] = e
	}
	return out, nil
}

// appendSortedKeys appends m's keys to buf in byte order. Given a buffer
// on the caller's stack, a small map costs no allocation.
func appendSortedKeys[V any](buf []string, m map[string]V) []string {
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}

// AppendAgeMapJSON appends an id → age map exactly as encoding/json
// encodes it, except that a nil map is written {} (proof.AppendAgeMapJSON).
func AppendAgeMapJSON(b []byte, m map[string]int64) []byte { return proof.AppendAgeMapJSON(b, m) }

// AppendJSONString appends s quoted exactly as encoding/json quotes it
// (proof.AppendJSONString).
func AppendJSONString(b []byte, s string) []byte { return proof.AppendJSONString(b, s) }

// member is one member of an object in the subset isCanonical accepts:
// its name and its value's bytes.
type member struct {
	name string
	raw  []byte
}

// simpleMembers returns the members of b, in order, if b is an object in
// the subset isCanonical accepts; ok is false for anything else. Built-in
// contracts decode their arguments and values through it, falling back to
// encoding/json (which takes several times as long) when it says no or a
// member is not of the type they want, so the two paths agree.
func simpleMembers(b []byte, dst []member) (ms []member, ok bool) {
	if len(b) < 2 || b[0] != '{' || !isCanonical(b) {
		return nil, false
	}
	if b[1] == '}' {
		return dst, true
	}
	// isCanonical vouched for the structure: each member is a string, a
	// colon and a value, followed by a comma or the closing brace.
	for i := 1; ; {
		j, _ := canonicalString(b, i)
		k, _ := canonicalValue(b, j+1, 1)
		dst = append(dst, member{name: string(b[i+1 : j-1]), raw: b[j+1 : k]})
		if b[k] == '}' {
			return dst, true
		}
		i = k + 1
	}
}

// simpleString is the value of a string member of the subset (which has
// no escapes: its bytes are its value).
func simpleString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	return string(raw[1 : len(raw)-1]), true
}

// simpleInt is the value of an integer member of the subset.
func simpleInt(raw []byte) (int64, bool) {
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// simpleStrings is the value of a member of the subset that is an array
// of strings.
func simpleStrings(raw []byte) ([]string, bool) {
	if len(raw) < 2 || raw[0] != '[' {
		return nil, false
	}
	out := []string{}
	for i := 1; raw[i] != ']'; {
		j, ok := canonicalString(raw, i)
		if !ok {
			return nil, false
		}
		out = append(out, string(raw[i+1:j-1]))
		if raw[j] == ',' {
			j++
		}
		i = j
	}
	return out, true
}

// appendSimpleString appends s as a JSON string in the subset, if it
// belongs there (printable ASCII without a quote or backslash).
func appendSimpleString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}
