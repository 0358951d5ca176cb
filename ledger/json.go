package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gowebpki/jcs"
	"go.starlark.net/starlark"
)

// maxSafeInt is the largest integer every JSON reader holds exactly (2^53−1,
// I-JSON, RFC 7493). Canonical JSON (RFC 8785) writes numbers as IEEE
// doubles, so a larger integer would change silently on the way through;
// the ledger rejects it instead.
const maxSafeInt = 1<<53 - 1

// maxJSONDepth bounds the nesting of arguments and values.
const maxJSONDepth = 64

// Canonical checks that b is one well-formed JSON text within the ledger's
// rules and returns its RFC 8785 canonical form. The rules, checked on the
// canonical form: no duplicate object keys, integers (numbers written with
// digits only) within ±(2^53−1), nesting at most 64. Errors wrap what.
//
// Most texts arrive canonical already (the SDK and the built-in contracts
// write them so); those are recognised in one pass and returned as they
// are, b itself, without the transform.
func Canonical(b []byte, what error) ([]byte, error) {
	if isCanonical(b) {
		return b, nil
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%w: not a JSON text", what)
	}
	out, err := jcs.Transform(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", what, err)
	}
	if err := checkCanonical(out); err != nil {
		return nil, fmt.Errorf("%w: %v", what, err)
	}
	return out, nil
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
				return fmt.Errorf("nested deeper than %d", maxJSONDepth)
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
			return fmt.Errorf("nested deeper than %d", maxJSONDepth)
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
// []any and map[string]any, rejecting duplicate keys, unsafe integers,
// non-finite numbers, excess nesting and trailing data.
func decodeJSON(b []byte) (any, error) {
	if !json.Valid(b) {
		return nil, fmt.Errorf("not a JSON text")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxJSONDepth)
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
	return f, nil
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
		return nil, fmt.Errorf("%w: nested deeper than %d", ErrBadValue, maxJSONDepth)
	}
	switch t := v.(type) {
	case starlark.NoneType:
		return nil, nil
	case starlark.Bool:
		return bool(t), nil
	case starlark.String:
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

// ageMapJSON encodes an id → age map as AppendAgeMapJSON does.
func ageMapJSON(m map[string]int64) []byte { return AppendAgeMapJSON(nil, m) }

// AppendAgeMapJSON appends an id → age map exactly as encoding/json
// encodes it (keys in byte order, escaped as AppendJSONString escapes
// them), without reflection, except that a nil map is written {}.
func AppendAgeMapJSON(b []byte, m map[string]int64) []byte {
	var kb [8]string
	keys := appendSortedKeys(kb[:0], m)
	n := 2
	for _, k := range keys {
		n += len(k) + 24 // quotes, colon, comma and up to 20 digits
	}
	b = slices.Grow(b, n)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendJSONString(b, k)
		b = append(b, ':')
		b = strconv.AppendInt(b, m[k], 10)
	}
	return append(b, '}')
}

// AppendJSONString appends s quoted exactly as encoding/json quotes it,
// without reflection for printable ASCII ('<', '>' and '&' escaped as
// \u003c, \u003e, \u0026). Asset ids are printable ASCII (checkAssetID);
// any other string takes encoding/json, with its escapes for control
// characters, invalid UTF-8 and U+2028/U+2029.
func AppendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '<', '>', '&':
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

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
