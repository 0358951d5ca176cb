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
	"go.starlark.net/syntax"
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

// Work accounting of hashing and comparison.
//
// The interpreter hashes and compares values recursively, inside one step,
// and values can share their parts: t = (t, t), forty times over, is a
// chain of forty-one pairs whose hash visits 2^41 nodes; a tuple of 32
// references to a tuple of 32 references to ..., eight levels deep (within
// the interpreter's comparison depth limit), compares equal to a copy of
// itself by visiting 32^8 pairs. Neither allocates: neither the memory
// budget nor the time limit (which acts between steps) stops them. So
// every place where a contract's values are hashed or compared —
// comparisons, in, dict and set keys, and the built-ins and methods that
// compare or hash (guard.go lists them) — first measures what the
// operation can visit, in units:
//
//	one per value reached, shared parts counted each time they are
//	reached (the value's expanded tree, as the interpreter walks it);
//	one more per bytesPerUnit bytes of a string or bytes value, and per
//	bitsPerUnit bits of an integer, which are compared a word at a time.
//
// The measure mirrors the interpreter's recursion (starlark.CompareDepth,
// with its depth limit; Tuple.Hash) without stopping at the first
// difference, so it bounds the operation from above, and it stops once it
// passes what the operation may still take, so that measuring costs no
// more than that. An operation is made of elementary hashes and
// comparisons (one for x == y, one per element for x in a list, one per
// key for set(), one per call of the sort's less function): each may
// visit freeUnits units for nothing — what the interpreter's step already
// paid for, as it does for a comparison of two integers — and the units
// beyond, its excess, are added up:
//
//   - an operation whose excess would pass maxWork (one unit per slot of
//     the memory budget: the nodes of the largest value the budget could
//     hold without sharing) is refused with ErrStepLimit before the
//     elementary operation that would pass it runs;
//   - otherwise its excess is charged as steps, unitsPerStep units a step,
//     so that the step budget bounds hashing and comparing as it bounds
//     everything else. Ordinary values (numbers, short strings, small
//     tuples and dicts) stay within freeUnits and are charged nothing.
//
// One step thus hashes and compares at most maxWork units beyond
// freeUnits per element the operation goes through (its elements are
// values the budget paid for), and the time limit, which acts between
// steps, stops a contract promptly again.
//
// Not measured: a single comparison one of whose operands has no elements
// (a number or a string: the other is then looked at only at its top),
// and the hash of a single key that is not a tuple; their cost is linear
// in bytes the memory budget already counted. Only tuples can be keys and
// have elements; a tuple hashed as a dict or set key (stored or looked up)
// may not pass maxKeyUnits, because a lookup also compares the key with
// the entries whose hash equals its own (below).
//
// Collisions. A lookup in a dict or set — to find, store or delete a key —
// compares the key with each entry of the table whose hash equals its own
// until one is equal (go.starlark.net's hashtable.go), and the hashes of
// contract values are 32 bits and easy to make equal: integers 2^32
// apart, floats of one integer part, tuples solved for a hash (the tuple
// hash is Python's), strings of fewer than twelve bytes (FNV; longer ones
// are seeded per process). n keys of one hash take n²/2 comparisons to put
// in one table, and one set(), dict(), update, union, | or == made them
// all in one step: 40,000 integers took 24 s, 5,000 tuples 37 s. So a
// lookup that a guard makes, or leads to, first counts the entries of its
// key's hash (collisions: a probe that walks the table comparing nothing),
// and accounts as one elementary operation
//
//	u + c·u - 1 units: hashing a key of u units and comparing it with
//	the c entries of its hash; 2u-1, as for one, if c ≤ freeCollisions
//
// — what any key cost before collisions were counted, so that ordinary
// tables cost what they did; the key of a lookup of one key that is not a
// tuple, whose hash was not measured, costs nothing until c passes
// freeCollisions. A lookup that would compare its key with more than
// maxCollisions entries is refused with ErrStepLimit.
//
// The operations that look up or store many keys in one call (set(),
// dict(), update, union, intersection, difference, symmetric_difference,
// issuperset, | & ^ - of sets, | and |= of dicts, and the comparisons of
// dicts and sets, within others or not) are done by the guards a key at a
// time (workMeter.next): each lookup accounted before it is made, the
// steps of the excess charged as they go, the thread's cancellation
// checked between keys; and a table they make is made at its final size,
// so that it does not grow, re-inserting every key, within them. Every
// key of a set arrives through a guard, so a set holds at most
// maxCollisions+1 keys of one hash; a dict filled by x[k] = v, a literal
// or a comprehension can hold more, each store a step of its own.
//
// Left unbounded within one step: the walk between comparisons. A lookup
// passes over every entry of its key's bucket, a few nanoseconds each,
// comparing only those of its hash, and keys whose hashes differ but
// share their low bits share a bucket; the operations above walk between
// cancellation checks, but for set < and <= and issubset (the
// interpreter's). And a table that grows, when a store passes its load
// factor, re-inserts every key: for keys that collide or share a bucket
// that costs, in the one step of the store (x[k] = v, a comprehension,
// update, add), about what storing them one by one did over many steps —
// within the time the execution has run, or that its contract's top level
// ran, if that built the table.
//
// Like the memory charges, the units are deterministic functions of the
// values involved, so a Validator re-executing a transaction charges and
// refuses exactly what the ledger did. (Keys whose hash is seeded collide
// by chance, a pair in 2^32: more than freeCollisions of them never do.)
const (
	bytesPerUnit   = 64   // bytes of a string or bytes value compared or hashed per unit
	bitsPerUnit    = 512  // bits of an integer compared per unit
	freeUnits      = 16   // units of one elementary hash or comparison its step pays for
	unitsPerStep   = 32   // units of excess charged as one step
	maxKeyUnits    = 256  // units of a tuple hashed as a dict or set key
	maxCollisions  = 1024 // entries of its hash one lookup may compare a key with
	freeCollisions = 4    // entries of its hash a lookup compares a key with for the price of one
)

// maxWork is the excess, in units, that one operation may take.
func (st *starThread) maxWork() int64 { return max(st.mem.limit/slotBytes, 1) }

// cost measures the units of hashing and comparing values, stopping
// (with n past cap) once n passes cap.
type cost struct {
	n, cap int64
	// nest is the deepest nesting of sequences an ordered comparison
	// reached: it compares the first differing pair of each level again.
	nest int
	// st, if not nil, is the thread whose cancellation stops the
	// measure (with err) before each probe of a table; crowd is the most
	// entries of one hash a lookup met (past maxCollisions, the measure
	// stops).
	st    *starThread
	err   error
	crowd int
}

func (c *cost) add(k int64) { c.n = addSat(c.n, k) }

func (c *cost) over() bool { return c.n > c.cap }

// leafUnits are the units of hashing or comparing x, which has no
// elements; 1 for anything else.
func leafUnits(x starlark.Value) int64 {
	switch x := x.(type) {
	case starlark.String:
		return 1 + int64(len(x))/bytesPerUnit
	case starlark.Bytes:
		return 1 + int64(len(x))/bytesPerUnit
	case starlark.Int:
		if _, ok := x.Int64(); ok {
			return 1
		}
		return 1 + bigIntBits(x)/bitsPerUnit
	}
	return 1
}

// bigIntBits bounds the bit length of x, which does not fit in an int64,
// without copying it (as intBits does): exactly up to the 1024 bits a
// float holds, maxIntBits beyond.
func bigIntBits(x starlark.Int) int64 {
	f := float64(x.Float())
	if math.IsInf(f, 0) {
		return maxIntBits
	}
	_, e := math.Frexp(f)
	return int64(e)
}

// hasElements reports whether comparing x can recurse into other values.
func hasElements(x starlark.Value) bool {
	switch x.(type) {
	case starlark.Tuple, *starlark.List, *starlark.Dict, *starlark.Set:
		return true
	}
	return false
}

// leafPair are the units of comparing x and y, at least one of which has
// no elements.
func leafPair(x, y starlark.Value) int64 {
	switch x := x.(type) {
	case starlark.String:
		if y, ok := y.(starlark.String); ok {
			return 1 + int64(min(len(x), len(y)))/bytesPerUnit
		}
	case starlark.Bytes:
		if y, ok := y.(starlark.Bytes); ok {
			return 1 + int64(min(len(x), len(y)))/bytesPerUnit
		}
	case starlark.Int:
		switch y := y.(type) {
		case starlark.Int:
			if _, ok := x.Int64(); ok {
				return 1
			}
			return min(leafUnits(x), leafUnits(y))
		case starlark.Float:
			return leafUnits(x) // as a big.Rat
		}
	case starlark.Float:
		if y, ok := y.(starlark.Int); ok {
			return leafUnits(y)
		}
	}
	return 1
}

// compare adds the units of starlark.CompareDepth(op, x, y, depth), op an
// equality if not ordered; level is the nesting of x and y. An ordered
// comparison is measured without the shortcut of unequal lengths (its
// first differing pair of each level is compared with op again, which
// takes none) and multiplied by nest afterwards (compareUnits).
func (c *cost) compare(ordered bool, x, y starlark.Value, depth, level int) {
	if c.over() {
		return
	}
	if depth < 1 {
		c.add(1) // "comparison exceeded maximum recursion depth"
		return
	}
	switch x := x.(type) {
	case starlark.Tuple:
		if y, ok := y.(starlark.Tuple); ok {
			for i := range c.seq(ordered, len(x), len(y), level) {
				if c.over() {
					return
				}
				if !hasElements(x[i]) {
					c.add(leafPair(x[i], y[i]))
					continue
				}
				c.compare(ordered, x[i], y[i], depth-1, level+1)
			}
			return
		}
	case *starlark.List:
		if y, ok := y.(*starlark.List); ok {
			for i := range c.seq(ordered, x.Len(), y.Len(), level) {
				if c.over() {
					return
				}
				if xe, ye := x.Index(i), y.Index(i); !hasElements(xe) {
					c.add(leafPair(xe, ye))
				} else {
					c.compare(ordered, xe, ye, depth-1, level+1)
				}
			}
			return
		}
	case *starlark.Dict:
		if y, ok := y.(*starlark.Dict); ok {
			// dictsEqual: each key of x looked up in y, and the values
			// compared, until a key is missing. (Ordered: an error.)
			c.add(1)
			if x.Len() != y.Len() {
				return
			}
			for k, v := range x.Entries() {
				if c.over() {
					return
				}
				c.lookup(y, k)
				if c.over() {
					return
				}
				yv, found, _ := y.Get(k)
				if !found {
					return
				}
				c.compare(ordered, v, yv, depth-1, level+1)
			}
			return
		}
	case *starlark.Set:
		if y, ok := y.(*starlark.Set); ok {
			// setsEqual looks x's elements up in y; subset and superset
			// look y's up in x.
			c.add(1)
			if !ordered {
				if x.Len() == y.Len() {
					c.keys(x, y)
				}
				return
			}
			c.keys(x, nil)
			c.add(int64(x.Len()))
			c.keys(y, x)
			return
		}
	}
	c.add(leafPair(x, y))
}

// seq starts compare for two lists or two tuples of lengths nx and ny
// (starlark's sliceCompare), and returns how many pairs of elements to
// compare.
func (c *cost) seq(ordered bool, nx, ny, level int) int {
	c.add(1)
	c.nest = max(c.nest, level+1)
	if !ordered && nx != ny {
		return 0
	}
	return min(nx, ny)
}

// keys adds the units of looking each element of s up in t (nil: a
// table where it meets no other of its hash).
func (c *cost) keys(s *starlark.Set, t starlark.Value) {
	for e := range s.Elements() {
		if c.over() {
			return
		}
		c.lookup(t, e)
	}
}

// lookup adds the units of looking k up in t, a dict or set (nil: a table
// where k meets no other of its hash): hashing k, and comparing it with
// each entry of t whose hash is k's, or with one if none. A lookup past
// maxCollisions entries stops the measure.
func (c *cost) lookup(t, k starlark.Value) {
	before := c.n
	c.hash(k, 0)
	u := c.n - before
	n := int64(1)
	if tableLen(t) > freeCollisions && !c.over() {
		if c.st != nil {
			if err := c.st.interrupted(); err != nil {
				c.err = err
				c.n = addSat(c.cap, 1)
				return
			}
		}
		if h, err := k.Hash(); err == nil {
			coll := collisions(t, h)
			c.crowd = max(c.crowd, coll)
			if coll > maxCollisions {
				c.n = addSat(c.cap, 1)
				return
			}
			n = charged(coll)
		}
	}
	c.add(mulSat(n, u) - 1)
}

// charged is the number of comparisons with the entries of its hash that
// a lookup is accounted for when it has c of them.
func charged(c int) int64 {
	if c <= freeCollisions {
		return 1
	}
	return int64(c)
}

// hash adds the units of k.Hash(), and reports whether k is hashable
// (where it is not, hashing fails). depth is k's nesting.
func (c *cost) hash(k starlark.Value, depth int) bool {
	switch k := k.(type) {
	case starlark.Tuple:
		c.add(1)
		if depth > maxReprDepth {
			c.n = addSat(c.cap, 1) // deeper than any key that passed maxKeyUnits
			return true
		}
		for _, e := range k {
			if c.over() {
				return true
			}
			if hasElements(e) {
				if !c.hash(e, depth+1) {
					return false
				}
			} else {
				c.add(leafUnits(e))
			}
		}
		return true
	case *starlark.List, *starlark.Dict, *starlark.Set:
		c.add(1)
		return false
	}
	c.add(leafUnits(k))
	return true
}

// compareUnits measures starlark.Compare(op, x, y), stopping past cap.
func compareUnits(op syntax.Token, x, y starlark.Value, cap int64) int64 {
	c := cost{cap: cap}
	return c.comparison(op, x, y)
}

// comparison measures starlark.Compare(op, x, y) and returns its units.
func (c *cost) comparison(op syntax.Token, x, y starlark.Value) int64 {
	ordered := op != syntax.EQL && op != syntax.NEQ
	c.compare(ordered, x, y, starlark.CompareLimit, 0)
	if ordered && c.nest > 1 {
		return mulSat(c.n, int64(c.nest))
	}
	return c.n
}

// tableLen is the number of keys of t if it is a dict or a set, else 0.
func tableLen(t starlark.Value) int64 {
	switch t := t.(type) {
	case *starlark.Dict:
		return int64(t.Len())
	case *starlark.Set:
		return int64(t.Len())
	}
	return 0
}

// collisions returns the number of entries of t, a dict or set, whose
// hash is h: those that a lookup of a key of hash h compares it with, if
// none is equal to it. It looks a probe up, which stands for such a key.
func collisions(t starlark.Value, h uint32) int {
	p := &probe{hash: h}
	switch t := t.(type) {
	case *starlark.Dict:
		_, _, _ = t.Get(p)
	case *starlark.Set:
		_, _ = t.Has(p)
	}
	return p.n
}

// probe is a key that counts the entries a lookup compares it with: it
// hashes as h, and equals nothing. To compare two values the interpreter
// asks first whether they are of the same type (starlark.CompareDepth's
// sameType): their Go types differing, it calls the probe's Type, whose
// name no other value has — once per entry whose hash is the probe's, then
// finds them unequal. TestCollisionProbe checks that the count is exact,
// so that a version of go.starlark.net that compares otherwise is caught.
type probe struct {
	hash uint32
	n    int
}

func (p *probe) Type() string          { p.n++; return "kiroku.probe" }
func (p *probe) String() string        { return "<probe>" }
func (p *probe) Freeze()               {}
func (p *probe) Truth() starlark.Bool  { return starlark.False }
func (p *probe) Hash() (uint32, error) { return p.hash, nil }

// workMeter accounts the hashing and comparing of one operation on st: its
// excess and, when done, the steps that excess is charged.
type workMeter struct {
	st *starThread
	// op names the operation, for a refusal, with the types of x and y
	// if not nil: "x op y", or "x.op()" for a method.
	op     string
	x, y   starlark.Value
	method bool
	excess int64
	// steps are the steps of excess charged so far (settle).
	steps int64
}

func (st *starThread) meter(op string, x, y starlark.Value) workMeter {
	return workMeter{st: st, op: op, x: x, y: y}
}

// what is the operation, as a refusal names it.
func (w *workMeter) what() string {
	switch {
	case w.method:
		return w.x.Type() + "." + w.op + "()"
	case w.x == nil:
		return w.op
	case w.y == nil:
		return w.x.Type() + w.op
	}
	return w.x.Type() + " " + w.op + " " + w.y.Type()
}

// room is the cap for measuring the next elementary hash or comparison:
// one unit past it refuses the operation.
func (w *workMeter) room() int64 { return freeUnits + w.st.maxWork() - w.excess }

// add accounts one elementary hash or comparison of units units, or
// refuses the operation if that takes its excess past maxWork.
func (w *workMeter) add(units int64) error {
	if units > freeUnits {
		w.excess = addSat(w.excess, units-freeUnits)
	}
	if w.excess > w.st.maxWork() {
		return w.st.refuseWork(fmt.Sprintf("%s would hash or compare more than %d units of nested values (shared parts counted each time they are reached)",
			w.what(), w.st.maxWork()))
	}
	return nil
}

// compare accounts a comparison of x and y with op, and the lookups in
// the dicts and sets it compares (refused past maxCollisions).
func (w *workMeter) compare(op syntax.Token, x, y starlark.Value) error {
	if !hasElements(x) || !hasElements(y) {
		return w.add(leafPair(x, y))
	}
	c := cost{cap: w.room(), st: w.st}
	units := c.comparison(op, x, y)
	if c.err != nil {
		return c.err
	}
	if c.crowd > maxCollisions {
		return w.refuseCrowd(c.crowd)
	}
	return w.add(units)
}

// key accounts hashing k as a dict or set key (and comparing it with the
// entry that holds it), refusing a tuple of more than maxKeyUnits. It
// reports whether k is hashable: where it is not, the operation fails.
func (w *workMeter) key(k starlark.Value) (bool, error) { return w.lookup(nil, k) }

// lookup accounts one of the lookups of an operation that looks up or
// stores many keys: of k in t, a dict or set (nil: a table where k meets
// no other of its hash), to find, store or delete it. That is hashing k,
// refused for a tuple of more than maxKeyUnits, and comparing it with the
// entries of t of its hash, refused past maxCollisions. It reports
// whether k is hashable: where it is not, the operation fails.
func (w *workMeter) lookup(t, k starlark.Value) (bool, error) { return w.account(t, k, true) }

// lookupOne accounts an operation's lookup of its one key k in t, as
// lookup does, but a key that is not a tuple only for the entries of its
// hash past freeCollisions: hashing it takes time linear in bytes the
// memory budget counted.
func (w *workMeter) lookupOne(t, k starlark.Value) (bool, error) {
	_, tuple := k.(starlark.Tuple)
	return w.account(t, k, tuple)
}

// account accounts a lookup of k in t, or, if not always, only its
// collisions past freeCollisions.
func (w *workMeter) account(t, k starlark.Value, always bool) (bool, error) {
	u, hashable, err := w.keyUnits(k)
	if err != nil || !hashable {
		return hashable, err
	}
	n := int64(1)
	// Count the entries of k's hash only where they can matter: where
	// the lookup could pass freeUnits or maxCollisions.
	if size := tableLen(t); size > freeCollisions && (mulSat(u, size+1)-1 > freeUnits || size > maxCollisions) {
		if h, err := k.Hash(); err == nil {
			c := collisions(t, h)
			if c > maxCollisions {
				return false, w.refuseCrowd(c)
			}
			n = charged(c)
		}
	}
	if n == 1 && !always {
		return true, nil
	}
	return true, w.add(addSat(u, mulSat(n, u)) - 1)
}

// keyUnits returns the units of hashing k as a key, refusing a tuple of
// more than maxKeyUnits, and whether k is hashable.
func (w *workMeter) keyUnits(k starlark.Value) (int64, bool, error) {
	if _, ok := k.(starlark.Tuple); !ok {
		c := cost{cap: w.room()}
		hashable := c.hash(k, 0)
		return c.n, hashable, nil
	}
	c := cost{cap: maxKeyUnits}
	hashable := c.hash(k, 0)
	if c.over() {
		return 0, false, w.st.refuseWork(fmt.Sprintf("%s: a tuple of more than %d units of nested values (shared parts counted each time they are reached) cannot be a dict or set key",
			w.what(), maxKeyUnits))
	}
	return c.n, hashable, nil
}

// refuseCrowd refuses a lookup that would compare its key with c entries
// of its hash.
func (w *workMeter) refuseCrowd(c int) error {
	return w.st.refuseWork(fmt.Sprintf("%s would compare a key with %d entries of the same hash, more than %d (integers 2^32 apart, floats of one integer part and tuples built to collide hash alike)",
		w.what(), c, maxCollisions))
}

// next readies the lookup of k in t that a bulk operation (one that looks
// up or stores many keys) is about to make: it fails if the thread has
// been cancelled, accounts the lookup, and charges the steps of the
// operation's excess so far, so that the time and step limits stop the
// operation between keys.
func (w *workMeter) next(t, k starlark.Value) error {
	if err := w.st.interrupted(); err != nil {
		return err
	}
	if _, err := w.lookup(t, k); err != nil {
		return err
	}
	return w.settle()
}

// settle charges as steps the excess accounted so far that is not yet
// charged.
func (w *workMeter) settle() error {
	n := w.excess/unitsPerStep - w.steps
	if n <= 0 {
		return nil
	}
	w.steps += n
	return w.st.chargeSteps(uint64(n))
}

// done charges the operation's excess as steps.
func (w *workMeter) done() error { return w.settle() }

// Freezing a contract's globals, when its top level has run, walks them
// as the interpreter's Freeze methods do: into a list, dict or set once
// (each marks itself frozen first), into a tuple and into a function's
// default values and captured variables each time it reaches them. Shared
// tuples make that walk exponential, like a hash, and a function that
// captures itself (def inner(): return inner, inside another) makes it
// endless: the process dies of a stack overflow, which no recover
// catches. freezeUnits measures the walk first, in units of values
// reached (shared parts counted each time), stopping past cap units or
// maxFreezeDepth deep.
func freezeUnits(globals starlark.StringDict, cap int64) int64 {
	f := freezeCost{cap: cap, seen: map[starlark.Value]bool{}}
	for _, v := range globals {
		if f.n > f.cap {
			break
		}
		f.value(v, 0)
	}
	return f.n
}

// maxFreezeDepth bounds the nesting freezeUnits walks: deeper than a top
// level's steps can build, so only a function that captures itself
// reaches it.
const maxFreezeDepth = topLevelSteps

type freezeCost struct {
	n, cap int64
	seen   map[starlark.Value]bool // lists, dicts and sets walked: frozen
}

func (f *freezeCost) value(x starlark.Value, depth int) {
	f.n++
	if f.n > f.cap {
		return
	}
	if depth > maxFreezeDepth {
		f.n = addSat(f.cap, 1)
		return
	}
	switch x := x.(type) {
	case starlark.Tuple:
		for _, e := range x {
			f.value(e, depth+1)
		}
	case *starlark.List, *starlark.Dict, *starlark.Set:
		if f.seen[x] {
			return
		}
		f.seen[x] = true
		switch x := x.(type) {
		case *starlark.List:
			for e := range x.Elements() {
				f.value(e, depth+1)
			}
		case *starlark.Dict:
			for k, v := range x.Entries() {
				f.value(k, depth+1)
				f.value(v, depth+1)
			}
		case *starlark.Set:
			for e := range x.Elements() {
				f.value(e, depth+1)
			}
		}
	case *starlark.Function:
		for i := range x.NumParams() {
			if d := x.ParamDefault(i); d != nil {
				f.value(d, depth+1)
			}
		}
		for i := range x.NumFreeVars() {
			if _, v := x.FreeVar(i); v != nil {
				f.value(v, depth+1)
			}
		}
	case *starlark.Builtin:
		if r := x.Receiver(); r != nil {
			f.value(r, depth+1)
		}
	}
}
