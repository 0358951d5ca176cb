package ledger

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.starlark.net/starlark"
)

// Memory accounting of Starlark contracts.
//
// go.starlark.net counts steps but not bytes, and one step can allocate
// without bound: 'x' * 500000000, s + s, list(range(100000000)), str() of
// a list holding a thousand references to one long string. The ledger
// therefore rewrites every contract when it compiles it (guard.go) so that
// each operation that can make a value larger than a constant per step
// first asks a hidden built-in to estimate the bytes its result will take.
// The estimate is charged to the execution's memAccount, and an operation
// that would take the total past Limits.MaxMemoryBytes fails with
// ErrMemoryLimit before it allocates anything.
//
// The charge is cumulative — bytes allocated, not bytes live: nothing tells
// the ledger when a value becomes garbage. Allocations the guards do not
// see are each bounded by a constant (a list literal, one append, a call's
// frame), so an execution's memory stays within MaxMemoryBytes plus a
// constant per step: in the ways of keeping something new at every step
// that TestPerStepAllocation tries, at most 32 bytes a step on average,
// 32 MB at the default million steps. (Building a string by repeated += copies it each
// time, and is charged each time: join charges once.) An error message
// can print a value as the execution ends; those that print values a
// contract chooses (fail, a missing key) print at most 1 KiB of them.
//
// Estimates follow Go's representation on 64-bit platforms (the sizes
// below) and are deterministic functions of the values involved, so a
// Validator re-executing a transaction charges exactly what the ledger did.

// Sizes, in bytes, that charges are made of.
const (
	slotBytes  = 16  // an interface value: one element of a list or tuple
	strBytes   = 16  // a string or bytes value's header, boxed in an interface
	listBytes  = 48  // a list: its header and slice, boxed
	tupleBytes = 24  // a tuple's slice header, boxed
	tableBytes = 512 // an empty dict or set: its header and the bucket of eight entries it holds inline
	entryBytes = 64  // one dict or set entry: hash, key, value, links, bucket share
	bigBytes   = 48  // a big integer's header, boxed, besides its words
	pairBytes  = tupleBytes + 2*slotBytes
)

// memAccount is the memory budget of one execution, nested calls
// included, or of one compilation of a contract's top level.
type memAccount struct {
	used, limit int64
	// refused describes the first charge refused: the execution fails
	// with ErrMemoryLimit whatever became of the error on its way out
	// (Starlark turns a built-in's error into its own).
	refused string
}

// charge adds n bytes, which what is about to allocate, or refuses them
// with ErrMemoryLimit, charging nothing, if the total would pass the limit.
func (m *memAccount) charge(n int64, what string) error {
	if n <= 0 {
		return nil
	}
	if n > m.limit-m.used {
		return m.refuse(what, n)
	}
	m.used += n
	return nil
}

// refuse refuses n bytes for what.
func (m *memAccount) refuse(what string, n int64) error {
	detail := fmt.Sprintf("%s would take %s, with %s of %s used", what, byteCount(n), byteCount(m.used), byteCount(m.limit))
	if m.refused == "" {
		m.refused = detail
	}
	return fmt.Errorf("%w: %s", ErrMemoryLimit, detail)
}

// note records err as the refusal, if it is one and the first: an
// estimate that fails on its own (an integer too large, a value nested too
// deep) refuses as a charge does.
func (m *memAccount) note(err error) error {
	if m.refused == "" && errors.Is(err, ErrMemoryLimit) {
		m.refused = strings.TrimPrefix(err.Error(), ErrMemoryLimit.Error()+": ")
	}
	return err
}

// room returns the bytes left in the budget.
func (m *memAccount) room() int64 { return m.limit - m.used }

func byteCount(n int64) string {
	switch {
	case n >= 10<<30:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 10<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 10<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Saturating arithmetic for estimates: a product of two counts a contract
// controls can overflow int64, and must then read as "too much".
func addSat(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

func mulSat(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// intBits returns the bit length of |x|. (A big Int is copied to measure
// it: go.starlark.net exposes no cheaper way. Contracts rarely hold one;
// JSON cannot.)
func intBits(x starlark.Int) int64 {
	if v, ok := x.Int64(); ok {
		if v < 0 {
			return int64(bits.Len64(uint64(-v)))
		}
		return int64(bits.Len64(uint64(v)))
	}
	return int64(x.BigInt().BitLen())
}

// maxIntBits bounds the integers a contract can make, 128 KiB each. Not
// for their memory, which the budget counts, but for their time: the
// interpreter cannot stop in the middle of one multiplication, division,
// conversion to text or parse, and on numbers of a few megabytes one takes
// seconds to minutes. At this size each takes milliseconds, so the time
// limit stops a contract promptly. (JSON only holds integers of 53 bits.)
const maxIntBits = 1 << 20

// intBytes is the charge for an integer result of up to b bits: nothing
// for one that fits in a machine word (a constant per step at most). A
// result that could pass maxIntBits is refused.
func intBytes(b int64) (int64, error) {
	if b < 63 {
		return 0, nil
	}
	if b > maxIntBits {
		return 0, fmt.Errorf("%w: an integer of up to %d bits, limit %d", ErrMemoryLimit, b, maxIntBits)
	}
	return bigBytes + (b+63)/64*8, nil
}

// lengthOf returns the number of elements iterating x yields, counting
// them (without keeping any) if x does not know; -1 if x is not iterable.
func lengthOf(x starlark.Value) int64 {
	if n := starlark.Len(x); n >= 0 {
		return int64(n)
	}
	it, ok := x.(starlark.Iterable)
	if !ok {
		return -1
	}
	iter := it.Iterate()
	defer iter.Done()
	var n int64
	var v starlark.Value
	for iter.Next(&v) {
		n++
	}
	return n
}

// maxReprDepth bounds the nesting the ledger converts to text (str, repr,
// %, format): deeper, the interpreter's recursive printer would use
// stack beyond any budget.
const maxReprDepth = 1000

// reprLen returns the length of the text starlark gives x (its String,
// which str and repr produce for anything but a string, and % and format
// for %r and !r), computed without building it and mirroring starlark's
// writeValue, including its "[...]" for a list or dict inside itself.
// Shared references count each time they are printed. It stops counting
// once the length passes limit, so it takes time proportional to limit at
// most, and returns an error for values nested deeper than maxReprDepth.
func reprLen(x starlark.Value, limit int64) (int64, error) {
	r := reprCounter{limit: limit}
	r.value(x, 0)
	return r.n, r.err
}

type reprCounter struct {
	n, limit int64
	path     []starlark.Value // lists and dicts being printed, for cycles
	err      error
}

func (r *reprCounter) add(n int64) { r.n = addSat(r.n, n) }

func (r *reprCounter) done() bool { return r.n > r.limit || r.err != nil }

func (r *reprCounter) onPath(x starlark.Value) bool {
	for _, p := range r.path {
		if p == x {
			return true
		}
	}
	return false
}

func (r *reprCounter) value(x starlark.Value, depth int) {
	if r.done() {
		return
	}
	if depth > maxReprDepth {
		r.err = fmt.Errorf("%w: a value nested more than %d deep cannot be converted to text", ErrMemoryLimit, maxReprDepth)
		return
	}
	switch x := x.(type) {
	case starlark.NoneType:
		r.add(4)
	case starlark.Bool:
		r.add(int64(len(x.String())))
	case starlark.Int:
		r.add(intTextLen(x))
	case starlark.String:
		r.add(r.quoted(string(x)))
	case starlark.Bytes:
		r.add(1 + r.quoted(string(x)))
	case *starlark.List:
		r.add(2)
		if r.onPath(x) {
			r.add(3)
			return
		}
		r.path = append(r.path, x)
		for i := 0; i < x.Len() && !r.done(); i++ {
			if i > 0 {
				r.add(2)
			}
			r.value(x.Index(i), depth+1)
		}
		r.path = r.path[:len(r.path)-1]
	case starlark.Tuple:
		r.add(2)
		for i, e := range x {
			if r.done() {
				return
			}
			if i > 0 {
				r.add(2)
			}
			r.value(e, depth+1)
		}
		if len(x) == 1 {
			r.add(1)
		}
	case *starlark.Dict:
		r.add(2)
		if r.onPath(x) {
			r.add(3)
			return
		}
		first := true
		for k, v := range x.Entries() {
			if r.done() {
				return
			}
			if !first {
				r.add(2)
			}
			first = false
			r.value(k, depth+1)
			r.add(2)
			r.path = append(r.path, x)
			r.value(v, depth+1)
			r.path = r.path[:len(r.path)-1]
		}
	case *starlark.Set:
		r.add(7) // set([])
		first := true
		for e := range x.Elements() {
			if r.done() {
				return
			}
			if !first {
				r.add(2)
			}
			first = false
			r.value(e, depth+1)
		}
	default:
		// Floats, functions, built-ins, ranges, the ledger: short, or
		// (a string's elems()) as long as a string already paid for.
		r.add(int64(len(x.String())))
	}
}

// quoted is quotedLen(s), or a lower bound of it that passes the limit.
func (r *reprCounter) quoted(s string) int64 {
	if r.n+int64(len(s))+2 > r.limit {
		return int64(len(s)) + 2
	}
	return quotedLen(s)
}

// intTextLen bounds the length of x in decimal, with its sign; exact for
// a machine-word integer.
func intTextLen(x starlark.Int) int64 {
	if v, ok := x.Int64(); ok {
		var buf [24]byte
		return int64(len(strconv.AppendInt(buf[:0], v, 10)))
	}
	// log10(2) < 0.30103; one more for the sign, one for rounding.
	return intBits(x)*30103/100000 + 2
}

// quotedLen is the length of syntax.Quote(s, false), which starlark uses to
// print a string: quotes, escapes for '"' and '\\', control characters,
// non-printing runes and invalid bytes.
func quotedLen(s string) int64 {
	n := int64(2)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch {
			case c == '"' || c == '\\':
				n += 2
			case c >= ' ' && c != 0x7f:
				n++
			case c == '\a' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t' || c == '\v':
				n += 2
			default:
				n += 4 // \xNN
			}
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		i += w
		switch {
		case w == 1: // invalid byte: \xNN
			n += 4
		case strconv.IsPrint(r):
			n += int64(w)
		case r < 0x10000:
			n += 6 // \uNNNN
		default:
			n += 10 // \UNNNNNNNN
		}
	}
	return n
}

// jsonFloor returns a lower bound of the length of x's canonical JSON (2
// per string beyond its bytes, 1 per other scalar, brackets and a
// separator per element), stopping once it passes limit, so that a value
// whose JSON cannot fit is refused before it is converted: with shared
// references a small value can stand for an enormous text. Values JSON
// cannot hold count 1; the conversion rejects them.
func jsonFloor(x starlark.Value, limit int64) int64 {
	var n int64
	var walk func(x starlark.Value, depth int)
	walk = func(x starlark.Value, depth int) {
		if n > limit || depth > maxJSONDepth {
			n++ // the conversion refuses the nesting itself
			return
		}
		switch x := x.(type) {
		case starlark.String:
			n = addSat(n, int64(len(x))+2)
		case *starlark.List:
			n += 2
			for i := 0; i < x.Len() && n <= limit; i++ {
				if i > 0 {
					n++ // ','
				}
				walk(x.Index(i), depth+1)
			}
		case starlark.Tuple:
			n += 2
			for i, e := range x {
				if n > limit {
					return
				}
				if i > 0 {
					n++
				}
				walk(e, depth+1)
			}
		case *starlark.Dict:
			n += 2
			first := true
			for k, v := range x.Entries() {
				if n > limit {
					return
				}
				if !first {
					n++
				}
				first = false
				n++ // ':'
				walk(k, depth+1)
				walk(v, depth+1)
			}
		default:
			n++
		}
	}
	walk(x, 0)
	return n
}

// valueBytes estimates the memory a value decoded from JSON holds (a
// tree: no sharing, nesting bounded by maxJSONDepth).
func valueBytes(x starlark.Value) int64 {
	switch x := x.(type) {
	case starlark.String:
		return strBytes + int64(len(x))
	case starlark.Float:
		return 8
	case *starlark.List:
		n := listBytes + slotBytes*int64(x.Len())
		for e := range x.Elements() {
			n += valueBytes(e)
		}
		return n
	case *starlark.Dict:
		n := tableBytes + entryBytes*int64(x.Len())
		for k, v := range x.Entries() {
			n += valueBytes(k) + valueBytes(v)
		}
		return n
	}
	return 0 // None, bools, safe integers: no allocation of their own
}
