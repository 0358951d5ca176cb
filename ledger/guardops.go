package ledger

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// The guards the rewritten contracts call (guard.go), and the guarded
// versions of the universe's functions. Each estimates in bytes what the
// operation is about to allocate, charges it to the execution's
// memAccount and only then runs the interpreter's own operation, so the
// semantics, and the error messages of everything but a refusal, stay the
// interpreter's.

const starKey = "kiroku.star"

// starOf returns the ledger's state of a Starlark thread.
func starOf(t *starlark.Thread) *starThread { return t.Local(starKey).(*starThread) }

type guardFunc func(th *starlark.Thread, st *starThread, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)

// guardBuiltin makes a guard that gives back steps steps: what the call of
// a guard costs beyond the instruction it replaced (the load of its name,
// the call, and the arguments the original did not have).
func guardBuiltin(name string, steps uint64, fn guardFunc) *starlark.Builtin {
	return starlark.NewBuiltin(name, func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		st := starOf(th)
		st.refund(steps)
		v, err := fn(th, st, args, kwargs)
		if err != nil {
			return nil, st.mem.note(err)
		}
		return v, nil
	})
}

// refund takes n steps off the thread's count. Steps not yet counted (the
// bound guard's jump, at the very start of a program) are taken off at the
// next guard.
func (st *starThread) refund(n uint64) {
	n += st.owed
	th := st.thread
	if th.Steps >= n {
		th.Steps -= n
		st.owed = 0
		return
	}
	st.owed = n - th.Steps
	th.Steps = 0
}

// predeclared are the names every contract sees besides the Starlark
// universe: fail, which replaces the universe's so that its message
// reaches the client as ErrContractFailed; print, which does nothing (not
// even format its arguments); the guarded universe functions; and the
// hidden guards.
var predeclared = func() starlark.StringDict {
	d := starlark.StringDict{
		"fail": starlark.NewBuiltin("fail", starFail),
		"print": starlark.NewBuiltin("print", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
			return starlark.None, nil
		}),
		"getattr":                 starlark.NewBuiltin("getattr", guardedGetattr),
		guardPrefix + "none":      starlark.None,
		guardPrefix + "neg":       guardBuiltin(guardPrefix+"neg", 1, unaryGuard(syntax.MINUS)),
		guardPrefix + "invert":    guardBuiltin(guardPrefix+"invert", 1, unaryGuard(syntax.TILDE)),
		guardPrefix + "iadd":      guardBuiltin(guardPrefix+"iadd", 1, augGuard(syntax.PLUS)),
		guardPrefix + "ipipe":     guardBuiltin(guardPrefix+"ipipe", 1, augGuard(syntax.PIPE)),
		guardPrefix + "item":      guardBuiltin(guardPrefix+"item", 1, itemGuard),
		guardPrefix + "aug_index": guardBuiltin(guardPrefix+"aug_index", 1, augIndex),
		guardPrefix + "slice":     guardBuiltin(guardPrefix+"slice", 1, sliceGuard),
		guardPrefix + "index":     guardBuiltin(guardPrefix+"index", 1, indexGuard),
		guardPrefix + "key":       guardBuiltin(guardPrefix+"key", 2, keyGuard),
		guardPrefix + "star":      guardBuiltin(guardPrefix+"star", 2, starArgsGuard),
		guardPrefix + "starstar":  guardBuiltin(guardPrefix+"starstar", 2, kwArgsGuard),
		guardPrefix + "attr":      guardBuiltin(guardPrefix+"attr", 2, attrGuard),
		guardPrefix + "dict":      guardBuiltin(guardPrefix+"dict", 2, dictGuard),
		guardPrefix + "bound": guardBuiltin(guardPrefix+"bound", 3, func(*starlark.Thread, *starThread, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
			return starlark.True, nil
		}),
	}
	for op, name := range binopGuards {
		d[name] = guardBuiltin(name, 1, binopGuard(op))
	}
	for op, name := range compareGuards {
		// In place of one instruction (IN, or a comparison): x not in y
		// is rewritten not __kiroku_in(x, y), in place of IN and NOT (or
		// of IN alone in a condition, which jumps the other way).
		if op == syntax.IN {
			d[name] = guardBuiltin(name, 1, inGuard)
		} else {
			d[name] = guardBuiltin(name, 1, compareGuard(op))
		}
	}
	d[guardPrefix+"hkey"] = guardBuiltin(guardPrefix+"hkey", 2, hkeyGuard)
	for name, est := range universeGuards {
		orig := starlark.Universe[name].(*starlark.Builtin)
		call := orig.CallInternal
		if impl, ok := universeImpls[name]; ok {
			call = func(th *starlark.Thread, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
				return impl(th, orig, args, kwargs)
			}
		}
		d[name] = starlark.NewBuiltin(name, func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			st := starOf(th)
			n, err := est(st, args, kwargs)
			if err == nil {
				err = st.mem.charge(n, name+"()")
			}
			if err != nil {
				return nil, st.mem.note(err)
			}
			return call(th, args, kwargs)
		})
	}
	for name, impl := range universeImpls {
		if _, ok := universeGuards[name]; !ok {
			orig := starlark.Universe[name].(*starlark.Builtin)
			d[name] = starlark.NewBuiltin(name, func(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
				return impl(th, orig, args, kwargs)
			})
		}
	}
	return d
}()

// ---- hashing and comparison ----

// compareGuard is x op y for a comparison op, its cost accounted first
// (memory.go).
func compareGuard(op syntax.Token) guardFunc {
	return func(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		x, y := args[0], args[1]
		if hasElements(x) && hasElements(y) {
			w := st.meter(op.String(), x, y)
			if err := w.compare(op, x, y); err != nil {
				return nil, err
			}
			if err := w.done(); err != nil {
				return nil, err
			}
		}
		ok, err := st.compare(op, x, y)
		if err != nil {
			return nil, err
		}
		return starlark.Bool(ok), nil
	}
}

// inGuard is x in y, its cost accounted first: a key's hash, or a
// comparison with each element up to the first equal one.
func inGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	x, y := args[0], args[1]
	switch y := y.(type) {
	case *starlark.Dict, *starlark.Set:
		if err := lookupCheck(st, "in", x, y, y, x); err != nil {
			return nil, err
		}
	case starlark.Tuple:
		return scanHas(st, y, x)
	case *starlark.List:
		return scanHas(st, y, x)
	}
	return starlark.Binary(syntax.IN, x, y)
}

// scanHas is the interpreter's x in y for a list or tuple y (its Has):
// each element compared with x, in turn, until one is equal.
func scanHas(st *starThread, y starlark.Indexable, x starlark.Value) (starlark.Value, error) {
	var w *workMeter
	if !cheapOperand(x) {
		m := st.meter("in", x, y)
		w = &m
	}
	for i := range y.Len() {
		e := y.Index(i)
		if w != nil {
			if err := w.compare(syntax.EQL, e, x); err != nil {
				return nil, err
			}
		}
		eq, err := st.compare(syntax.EQL, e, x)
		if err != nil {
			return nil, errDone(w, err)
		}
		if eq {
			return starlark.True, errDone(w, nil)
		}
	}
	return starlark.False, errDone(w, nil)
}

// errDone is err, or the error of charging w's steps.
func errDone(w *workMeter, err error) error {
	if w == nil || err != nil {
		return err
	}
	return w.done()
}

// cheapOperand reports whether comparing x with anything costs at most
// freeUnits: x has no elements, and compares with a string or an integer
// a few words at a time at most.
func cheapOperand(x starlark.Value) bool {
	return !hasElements(x) && leafUnits(x) <= freeUnits
}

// keyCheck accounts hashing k as one key of a dict or set for the
// operation (op, x, y) names (workMeter): a tuple is measured, and refused
// past maxKeyUnits; anything else hashes in time linear in bytes the
// memory budget counted.
func keyCheck(st *starThread, op string, x, y, k starlark.Value) error {
	if _, ok := k.(starlark.Tuple); !ok {
		return nil
	}
	w := st.meter(op, x, y)
	if _, err := w.key(k); err != nil {
		return err
	}
	return w.done()
}

// lookupCheck accounts a lookup of k in t, a dict or set, for the
// operation (op, x, y) names: its hash, and its comparisons with the
// entries of its hash (memory.go).
func lookupCheck(st *starThread, op string, x, y, t, k starlark.Value) error {
	w := st.meter(op, x, y)
	if _, err := w.lookupOne(t, k); err != nil {
		return err
	}
	return w.done()
}

// hkeyGuard passes through a key about to be stored with x[k] = v, or
// by a dict comprehension, having accounted its hash.
func hkeyGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	if err := keyCheck(st, "a key stored", nil, nil, args[0]); err != nil {
		return nil, err
	}
	return args[0], nil
}

// compare is starlark.Compare(op, x, y), which the guards use once they
// have accounted it: the same result and errors, but the comparisons of
// dicts and sets — within tuples and lists or not — look their keys up
// one at a time here, stopping if the thread is cancelled (memory.go,
// "Collisions"). An ordered comparison of sets that is a subset test
// (< and <=) is the interpreter's, whose walk of each key's entries
// (hashtable.go's count) only it can make.
func (st *starThread) compare(op syntax.Token, x, y starlark.Value) (bool, error) {
	return st.compareDepth(op, x, y, starlark.CompareLimit)
}

// compareDepth is starlark.CompareDepth (value.go), whose recursion into
// tuples, lists, dicts and sets (sliceCompare, dictsEqual, setsEqual,
// IsSuperset) it follows.
func (st *starThread) compareDepth(op syntax.Token, x, y starlark.Value, depth int) (bool, error) {
	if depth < 1 {
		return false, errors.New("comparison exceeded maximum recursion depth")
	}
	switch x := x.(type) {
	case starlark.Tuple:
		if y, ok := y.(starlark.Tuple); ok {
			return compareSeq(st, op, x, y, depth)
		}
	case *starlark.List:
		if y, ok := y.(*starlark.List); ok {
			return compareSeq(st, op, x, y, depth)
		}
	case *starlark.Dict:
		if y, ok := y.(*starlark.Dict); ok && (op == syntax.EQL || op == syntax.NEQ) {
			eq, err := st.dictsEqual(x, y, depth)
			return eq != (op == syntax.NEQ), err
		}
	case *starlark.Set:
		if y, ok := y.(*starlark.Set); ok {
			switch op {
			case syntax.EQL, syntax.NEQ:
				eq, err := st.setsEqual(x, y)
				return eq != (op == syntax.NEQ), err
			case syntax.GE, syntax.GT:
				if x.Len() < y.Len() || op == syntax.GT && x.Len() == y.Len() {
					return false, nil
				}
				return st.superset(x, y)
			}
		}
	}
	return starlark.CompareDepth(op, x, y, depth)
}

// compareSeq is the interpreter's sliceCompare, of two lists or two
// tuples. (Generic, so that a tuple is not boxed as an Indexable.)
func compareSeq[S interface {
	Len() int
	Index(int) starlark.Value
}](st *starThread, op syntax.Token, x, y S, depth int) (bool, error) {
	if x.Len() != y.Len() && (op == syntax.EQL || op == syntax.NEQ) {
		return op == syntax.NEQ, nil
	}
	for i := 0; i < x.Len() && i < y.Len(); i++ {
		xi, yi := x.Index(i), y.Index(i)
		if eq, err := st.compareDepth(syntax.EQL, xi, yi, depth-1); err != nil {
			return false, err
		} else if !eq {
			switch op {
			case syntax.EQL:
				return false, nil
			case syntax.NEQ:
				return true, nil
			}
			return st.compareDepth(op, xi, yi, depth-1)
		}
	}
	return threeway(op, x.Len()-y.Len()), nil
}

// threeway is the interpreter's: op applied to the result of a three-way
// comparison.
func threeway(op syntax.Token, cmp int) bool {
	switch op {
	case syntax.EQL:
		return cmp == 0
	case syntax.NEQ:
		return cmp != 0
	case syntax.LE:
		return cmp <= 0
	case syntax.LT:
		return cmp < 0
	case syntax.GE:
		return cmp >= 0
	}
	return cmp > 0 // syntax.GT
}

// dictsEqual is the interpreter's: each key of x looked up in y (its
// errors ignored), and the values compared.
func (st *starThread) dictsEqual(x, y *starlark.Dict, depth int) (bool, error) {
	if x.Len() != y.Len() {
		return false, nil
	}
	for k, xv := range x.Entries() {
		if err := st.interrupted(); err != nil {
			return false, err
		}
		yv, found, _ := y.Get(k)
		if !found {
			return false, nil
		}
		if eq, err := st.compareDepth(syntax.EQL, xv, yv, depth-1); err != nil || !eq {
			return false, err
		}
	}
	return true, nil
}

// setsEqual is the interpreter's: each element of x looked up in y (its
// errors ignored).
func (st *starThread) setsEqual(x, y *starlark.Set) (bool, error) {
	if x.Len() != y.Len() {
		return false, nil
	}
	for e := range x.Elements() {
		if err := st.interrupted(); err != nil {
			return false, err
		}
		if found, _ := y.Has(e); !found {
			return false, nil
		}
	}
	return true, nil
}

// superset is the interpreter's x.IsSuperset(y.Iterate()).
func (st *starThread) superset(x, y *starlark.Set) (bool, error) {
	iter := y.Iterate()
	defer iter.Done()
	var e starlark.Value
	for iter.Next(&e) {
		if err := st.interrupted(); err != nil {
			return false, err
		}
		if found, err := x.Has(e); err != nil || !found {
			return false, err
		}
	}
	return true, nil
}

// ---- dicts and sets, a key at a time ----

// The operations that look up or store many keys in one call: the
// universe's set and dict, dict.update, the set methods of
// tableMethods, and | & ^ - of sets and | of dicts (|= of dicts is
// inplace). Each does what the interpreter's does (library.go, value.go,
// eval.go), in the same order, with the same results and errors, but a
// key at a time: each lookup readied by workMeter.next — its hash and
// collisions accounted, the steps charged so far, the thread's
// cancellation checked — and each new table made at its final size, so
// that it does not grow, rehashing every key, within the operation.
// Errors of the accounting are returned as they are; the interpreter's
// are named as the interpreter names them.

// nameErr is the interpreter's: "name: msg".
func nameErr(b *starlark.Builtin, msg any) error { return fmt.Errorf("%s: %v", b.Name(), msg) }

// named returns a function that names an error as a method or function
// of that name does.
func named(name string) func(error) error {
	return func(err error) error { return fmt.Errorf("%s: %v", name, err) }
}

// sizeHint is the number of keys x, an argument, holds, if it knows; 0 if
// not.
func sizeHint(x starlark.Value) int { return max(0, starlark.Len(x)) }

// guardedSet is the universe's set.
func guardedSet(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var iterable starlark.Iterable
	if err := starlark.UnpackPositionalArgs("set", args, kwargs, 0, &iterable); err != nil {
		return nil, err
	}
	if iterable == nil {
		return new(starlark.Set), nil
	}
	w := starOf(th).meter("set()", nil, nil)
	s := starlark.NewSet(sizeHint(iterable))
	iter := iterable.Iterate()
	defer iter.Done()
	var x starlark.Value
	for iter.Next(&x) {
		if err := w.next(s, x); err != nil {
			return nil, err
		}
		if err := s.Insert(x); err != nil {
			return nil, nameErr(b, err)
		}
	}
	return s, w.done()
}

// guardedDict is the universe's dict.
func guardedDict(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) > 1 {
		return nil, fmt.Errorf("dict: got %d arguments, want at most 1", len(args))
	}
	n := len(kwargs)
	if len(args) == 1 {
		n += sizeHint(args[0])
	}
	w := starOf(th).meter("dict()", nil, nil)
	d := starlark.NewDict(n)
	if err := updateDict(&w, d, args, kwargs, named("dict")); err != nil {
		return nil, err
	}
	return d, w.done()
}

// tableUpdate is dict.update and set.update.
func tableUpdate(w *workMeter, m *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	switch recv := m.Receiver().(type) {
	case *starlark.Dict:
		if len(args) > 1 {
			return nil, fmt.Errorf("update: got %d arguments, want at most 1", len(args))
		}
		if err := updateDict(w, recv, args, kwargs, named("update")); err != nil {
			return nil, err
		}
	case *starlark.Set:
		if err := setUpdate(w, recv, args, kwargs, named(m.Name())); err != nil {
			return nil, err
		}
	}
	return starlark.None, nil
}

// updateDict is the interpreter's, d updated with updates (at most one)
// and kwargs; name names its errors.
func updateDict(w *workMeter, d *starlark.Dict, updates starlark.Tuple, kwargs []starlark.Tuple, name func(error) error) error {
	if len(updates) == 1 {
		switch updates := updates[0].(type) {
		case starlark.IterableMapping:
			for _, item := range updates.Items() {
				if err := w.next(d, item[0]); err != nil {
					return err
				}
				if err := d.SetKey(item[0], item[1]); err != nil {
					return name(err)
				}
			}
		default:
			iter := starlark.Iterate(updates)
			if iter == nil {
				return name(fmt.Errorf("got %s, want iterable", updates.Type()))
			}
			defer iter.Done()
			// Each pair stays iterated until the update ends, as in the
			// interpreter (a pair that is d makes the next store fail).
			var pairs []starlark.Iterator
			defer func() {
				for _, it := range pairs {
					it.Done()
				}
			}()
			var pair starlark.Value
			for i := 0; iter.Next(&pair); i++ {
				iter2 := starlark.Iterate(pair)
				if iter2 == nil {
					return name(fmt.Errorf("dictionary update sequence element #%d is not iterable (%s)", i, pair.Type()))
				}
				pairs = append(pairs, iter2)
				n := starlark.Len(pair)
				if n < 0 {
					return name(fmt.Errorf("dictionary update sequence element #%d has unknown length (%s)", i, pair.Type()))
				} else if n != 2 {
					return name(fmt.Errorf("dictionary update sequence element #%d has length %d, want 2", i, n))
				}
				var k, v starlark.Value
				iter2.Next(&k)
				iter2.Next(&v)
				if err := w.next(d, k); err != nil {
					return err
				}
				if err := d.SetKey(k, v); err != nil {
					return name(err)
				}
			}
		}
	}
	before := d.Len()
	for _, pair := range kwargs {
		if err := w.next(d, pair[0]); err != nil {
			return err
		}
		if err := d.SetKey(pair[0], pair[1]); err != nil {
			return name(err)
		}
	}
	if d.Len() < before+len(kwargs) {
		keys := make(map[starlark.String]bool, len(kwargs))
		for _, kv := range kwargs {
			k := kv[0].(starlark.String)
			if keys[k] {
				return name(fmt.Errorf("duplicate keyword arg: %v", k))
			}
			keys[k] = true
		}
	}
	return nil
}

// setUpdate is the interpreter's, s updated with the elements of args;
// name names its errors.
func setUpdate(w *workMeter, s *starlark.Set, args starlark.Tuple, kwargs []starlark.Tuple, name func(error) error) error {
	if len(kwargs) > 0 {
		return name(errors.New("does not accept keyword arguments"))
	}
	for i, arg := range args {
		iterable, ok := arg.(starlark.Iterable)
		if !ok {
			return name(fmt.Errorf("argument #%d is not iterable: %s", i+1, arg.Type()))
		}
		if err := func() error {
			iter := iterable.Iterate()
			defer iter.Done()
			return insertAll(w, s, iter, name)
		}(); err != nil {
			return err
		}
	}
	return nil
}

// insertAll is the interpreter's s.InsertAll(iter).
func insertAll(w *workMeter, s *starlark.Set, iter starlark.Iterator, name func(error) error) error {
	var x starlark.Value
	for iter.Next(&x) {
		if err := w.next(s, x); err != nil {
			return err
		}
		if err := s.Insert(x); err != nil {
			return name(err)
		}
	}
	return nil
}

// cloneSet is the interpreter's s.clone(), with room for extra more keys.
func cloneSet(w *workMeter, s *starlark.Set, extra int) (*starlark.Set, error) {
	c := starlark.NewSet(s.Len() + extra)
	for e := range s.Elements() {
		if err := w.next(c, e); err != nil {
			return nil, err
		}
		_ = c.Insert(e) // c is new: cannot fail
	}
	return c, nil
}

// setUnion is set.union.
func setUnion(w *workMeter, m *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	extra := 0
	for _, a := range args {
		extra += sizeHint(a)
	}
	u, err := cloneSet(w, m.Receiver().(*starlark.Set), extra)
	if err != nil {
		return nil, err
	}
	if err := setUpdate(w, u, args, kwargs, named(m.Name())); err != nil {
		return nil, err
	}
	return u, nil
}

// setWithOther is set.intersection, difference, symmetric_difference and
// issuperset, of one iterable.
func setWithOther(w *workMeter, m *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var other starlark.Iterable
	if err := starlark.UnpackPositionalArgs(m.Name(), args, kwargs, 0, &other); err != nil {
		return nil, err
	}
	if other == nil {
		// The interpreter panics (setOpBytes refuses it first).
		return nil, fmt.Errorf("%s: got 0 arguments, want 1", m.Name())
	}
	s := m.Receiver().(*starlark.Set)
	iter := other.Iterate()
	defer iter.Done()
	var z starlark.Value
	var err error
	switch m.Name() {
	case "intersection":
		z, err = setIntersection(w, s, iter, sizeHint(other))
	case "difference":
		z, err = setDifference(w, s, iter)
	case "symmetric_difference":
		z, err = setSymmetricDifference(w, s, iter, sizeHint(other))
	default: // issuperset
		var ok bool
		ok, err = setIsSuperset(w, s, iter)
		z = starlark.Bool(ok)
	}
	if err != nil {
		var own ownErr
		if errors.As(err, &own) {
			return nil, nameErr(m, own.error)
		}
		return nil, err
	}
	return z, nil
}

// ownErr marks an error of the interpreter's operation, which the caller
// names as the interpreter does, where errors of the accounting pass as
// they are.
type ownErr struct{ error }

// setIntersection is the interpreter's s.Intersection(other).
func setIntersection(w *workMeter, s *starlark.Set, other starlark.Iterator, size int) (*starlark.Set, error) {
	z := starlark.NewSet(min(s.Len(), size))
	var x starlark.Value
	for other.Next(&x) {
		if err := w.next(s, x); err != nil {
			return nil, err
		}
		found, err := s.Has(x)
		if err != nil {
			return nil, ownErr{err}
		}
		if found {
			if err := w.next(z, x); err != nil {
				return nil, err
			}
			if err := z.Insert(x); err != nil {
				return nil, ownErr{err}
			}
		}
	}
	return z, nil
}

// setDifference is the interpreter's s.Difference(other).
func setDifference(w *workMeter, s *starlark.Set, other starlark.Iterator) (*starlark.Set, error) {
	if s.Len() == 0 {
		// The interpreter's clone of an empty set has no table, and
		// deleting from it hashes nothing: no key fails.
		return new(starlark.Set), nil
	}
	z, err := cloneSet(w, s, 0)
	if err != nil {
		return nil, err
	}
	var x starlark.Value
	for other.Next(&x) {
		if err := w.next(z, x); err != nil {
			return nil, err
		}
		if _, err := z.Delete(x); err != nil {
			return nil, ownErr{err}
		}
	}
	return z, nil
}

// setSymmetricDifference is the interpreter's
// s.SymmetricDifference(other).
func setSymmetricDifference(w *workMeter, s *starlark.Set, other starlark.Iterator, size int) (*starlark.Set, error) {
	z, err := cloneSet(w, s, size)
	if err != nil {
		return nil, err
	}
	// tableless is whether the interpreter's z would have no table yet:
	// a clone of an empty set, nothing stored. Deleting from it hashes
	// nothing.
	tableless := s.Len() == 0
	var x starlark.Value
	for other.Next(&x) {
		if err := w.next(z, x); err != nil {
			return nil, err
		}
		found := false
		if !tableless {
			if found, err = z.Delete(x); err != nil {
				return nil, ownErr{err}
			}
		}
		if !found {
			if err := w.next(z, x); err != nil {
				return nil, err
			}
			_ = z.Insert(x) // as the interpreter: its error ignored
			tableless = false
		}
	}
	return z, nil
}

// setIsSuperset is the interpreter's s.IsSuperset(other).
func setIsSuperset(w *workMeter, s *starlark.Set, other starlark.Iterator) (bool, error) {
	var x starlark.Value
	for other.Next(&x) {
		if err := w.next(s, x); err != nil {
			return false, err
		}
		found, err := s.Has(x)
		if err != nil {
			return false, ownErr{err}
		}
		if !found {
			return false, nil
		}
	}
	return true, nil
}

// tableBinop is x op y for two dicts (|) or two sets (| & ^ -), as the
// interpreter's Binary; ok is false for other operands.
func tableBinop(w *workMeter, op syntax.Token, x, y starlark.Value) (starlark.Value, bool, error) {
	switch x := x.(type) {
	case *starlark.Dict:
		y, isDict := y.(*starlark.Dict)
		if !isDict || op != syntax.PIPE {
			return nil, false, nil
		}
		// x.Union(y)
		u := starlark.NewDict(x.Len() + y.Len())
		for _, t := range []*starlark.Dict{x, y} {
			for k, v := range t.Entries() {
				if err := w.next(u, k); err != nil {
					return nil, true, err
				}
				_ = u.SetKey(k, v) // u is new: cannot fail
			}
		}
		return u, true, nil
	case *starlark.Set:
		y, isSet := y.(*starlark.Set)
		if !isSet || op != syntax.PIPE && op != syntax.AMP && op != syntax.CIRCUMFLEX && op != syntax.MINUS {
			return nil, false, nil
		}
		z, err := setBinop(w, op, x, y)
		var own ownErr
		if errors.As(err, &own) {
			err = own.error
		}
		if err != nil {
			return nil, true, err
		}
		return z, true, nil
	}
	return nil, false, nil
}

// setBinop is x op y for two sets and op one of | & ^ -.
func setBinop(w *workMeter, op syntax.Token, x, y *starlark.Set) (*starlark.Set, error) {
	iter := y.Iterate()
	defer iter.Done()
	switch op {
	case syntax.PIPE:
		u, err := cloneSet(w, x, y.Len())
		if err == nil {
			err = insertAll(w, u, iter, func(err error) error { return ownErr{err} })
		}
		return u, err
	case syntax.AMP:
		return setIntersection(w, x, iter, y.Len())
	case syntax.CIRCUMFLEX:
		return setSymmetricDifference(w, x, iter, y.Len())
	}
	return setDifference(w, x, iter)
}

// ---- operators ----

func binopGuard(op syntax.Token) guardFunc {
	what := "the result of " + op.String()
	return func(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		x, y := args[0], args[1]
		n, err := binopBytes(op, x, y, st.mem.room())
		if err == nil {
			err = st.mem.charge(n, what)
		}
		if err != nil {
			return nil, err
		}
		if tableLike(x) {
			w := st.meter(op.String(), x, y)
			if z, ok, err := tableBinop(&w, op, x, y); ok {
				if err != nil {
					return nil, err
				}
				return z, w.done()
			}
		}
		return starlark.Binary(op, x, y)
	}
}

// binopBytes estimates what x op y allocates (starlark.Binary's cases).
func binopBytes(op syntax.Token, x, y starlark.Value, room int64) (int64, error) {
	xi, xInt := x.(starlark.Int)
	yi, yInt := y.(starlark.Int)
	if xInt && yInt {
		bx, by := intBits(xi), intBits(yi)
		switch op {
		case syntax.PLUS, syntax.MINUS:
			return intBytes(max(bx, by) + 1)
		case syntax.STAR:
			return intBytes(bx + by)
		case syntax.SLASHSLASH, syntax.GTGT:
			return intBytes(bx)
		case syntax.PERCENT:
			return intBytes(by)
		case syntax.PIPE, syntax.AMP, syntax.CIRCUMFLEX:
			return intBytes(max(bx, by))
		case syntax.LTLT:
			if s, err := starlark.AsInt32(y); err == nil && s >= 0 && s < 512 {
				return intBytes(bx + int64(s))
			}
		}
		return 0, nil
	}
	switch op {
	case syntax.PLUS:
		switch x := x.(type) {
		case starlark.String:
			if y, ok := y.(starlark.String); ok {
				return strBytes + int64(len(x)) + int64(len(y)), nil
			}
		case starlark.Bytes:
			if y, ok := y.(starlark.Bytes); ok {
				return strBytes + int64(len(x)) + int64(len(y)), nil
			}
		case *starlark.List:
			if y, ok := y.(*starlark.List); ok {
				return listBytes + slotBytes*int64(x.Len()+y.Len()), nil
			}
		case starlark.Tuple:
			if y, ok := y.(starlark.Tuple); ok {
				return tupleBytes + slotBytes*int64(len(x)+len(y)), nil
			}
		}
	case syntax.STAR:
		if xInt {
			return repeatBytes(y, xi), nil
		}
		if yInt {
			return repeatBytes(x, yi), nil
		}
	case syntax.PERCENT:
		if f, ok := x.(starlark.String); ok {
			n, err := interpolateLen(string(f), y, room)
			return strBytes + mulSat(2, n), err
		}
	case syntax.MINUS:
		if x, ok := x.(*starlark.Set); ok {
			return tableBytes + entryBytes*int64(x.Len()), nil
		}
	case syntax.PIPE:
		switch x := x.(type) {
		case *starlark.Dict:
			if y, ok := y.(*starlark.Dict); ok {
				return tableBytes + entryBytes*int64(x.Len()+y.Len()), nil
			}
		case *starlark.Set:
			if y, ok := y.(*starlark.Set); ok {
				return tableBytes + entryBytes*int64(x.Len()+y.Len()), nil
			}
		}
	case syntax.AMP, syntax.CIRCUMFLEX:
		if x, ok := x.(*starlark.Set); ok {
			if y, ok := y.(*starlark.Set); ok {
				if op == syntax.AMP {
					return tableBytes + entryBytes*int64(min(x.Len(), y.Len())), nil
				}
				return tableBytes + entryBytes*int64(x.Len()+y.Len()), nil
			}
		}
	}
	return 0, nil
}

// repeatBytes estimates seq * n.
func repeatBytes(seq starlark.Value, n starlark.Int) int64 {
	var each, base int64
	var length int
	switch s := seq.(type) {
	case starlark.String:
		each, base, length = 1, strBytes, len(s)
	case starlark.Bytes:
		each, base, length = 1, strBytes, len(s)
	case *starlark.List:
		each, base, length = slotBytes, listBytes, s.Len()
	case starlark.Tuple:
		each, base, length = slotBytes, tupleBytes, len(s)
	default:
		return 0
	}
	if length == 0 || n.Sign() <= 0 {
		return 0
	}
	times, ok := n.Int64()
	if !ok {
		return 1<<63 - 1
	}
	return addSat(base, mulSat(each*int64(length), times))
}

func unaryGuard(op syntax.Token) guardFunc {
	what := "the result of unary " + op.String()
	return func(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		if x, ok := args[0].(starlark.Int); ok {
			n, err := intBytes(intBits(x) + 1)
			if err == nil {
				err = st.mem.charge(n, what)
			}
			if err != nil {
				return nil, err
			}
		}
		return starlark.Unary(op, args[0])
	}
}

// augGuard is v += y and v |= y, which extend a list and update a dict in
// place (the interpreter's INPLACE_ADD and INPLACE_PIPE), and are x + y
// and x | y otherwise.
func augGuard(op syntax.Token) guardFunc {
	return func(th *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		return inplace(th, st, op, args[0], args[1])
	}
}

func inplace(th *starlark.Thread, st *starThread, op syntax.Token, x, y starlark.Value) (starlark.Value, error) {
	switch x := x.(type) {
	case *starlark.List:
		if _, ok := y.(starlark.Iterable); ok && op == syntax.PLUS {
			// Extending a list copies it when it grows: twice the slots
			// added, amortised.
			if err := st.mem.charge(2*slotBytes*max(0, lengthOf(y)), "+= on a list"); err != nil {
				return nil, err
			}
			ext, _ := x.Attr("extend")
			if _, err := ext.(*starlark.Builtin).CallInternal(th, starlark.Tuple{y}, nil); err != nil {
				// Only the list's own state fails extend (y is
				// iterable): say it as += does.
				if strings.HasSuffix(err.Error(), "during iteration") {
					return nil, fmt.Errorf("cannot apply += to list during iteration")
				}
				return nil, fmt.Errorf("cannot apply += to frozen list")
			}
			return x, nil
		}
	case *starlark.Dict:
		if y, ok := y.(*starlark.Dict); ok && op == syntax.PIPE {
			// A delete of a key no dict holds fails, changing nothing,
			// exactly when |= must: x frozen or iterated.
			if _, _, err := x.Delete(absentKey{}); err != nil {
				return nil, fmt.Errorf("%s", strings.Replace(err.Error(), "delete from", "apply |= to", 1))
			}
			if err := st.mem.charge((entryBytes+pairBytes)*int64(y.Len()), "|= on a dict"); err != nil {
				return nil, err
			}
			w := st.meter("|=", x, y)
			for _, kv := range y.Items() { // a copy: x may be y
				if err := w.next(x, kv[0]); err != nil {
					return nil, err
				}
				if err := x.SetKey(kv[0], kv[1]); err != nil {
					return nil, err
				}
			}
			return x, w.done()
		}
	}
	return binopGuard(op)(th, st, starlark.Tuple{x, y}, nil)
}

// itemGuard reads a[i] for a[i] op= y, and hands (a, i, a[i]) to
// augIndex.
func itemGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	cur, err := getIndex(st, args[0], args[1])
	if err != nil {
		return nil, err
	}
	return starlark.Tuple{args[0], args[1], cur}, nil
}

// absentKey is a hashable value no contract can make, so no dict holds it.
type absentKey struct{}

func (absentKey) String() string        { return "<absent>" }
func (absentKey) Type() string          { return "absent" }
func (absentKey) Freeze()               {}
func (absentKey) Truth() starlark.Bool  { return starlark.False }
func (absentKey) Hash() (uint32, error) { return 1, nil }

// augIndex is the rest of a[i] op= y: the operation (in place for += on a
// list and |= on a dict), and a[i] stored.
func augIndex(th *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	item, opName, y := args[0].(starlark.Tuple), string(args[1].(starlark.String)), args[2]
	a, i, cur := item[0], item[1], item[2]
	op := augOps[opName]
	var err error
	var z starlark.Value
	switch op {
	case syntax.PLUS, syntax.PIPE:
		z, err = inplace(th, st, op, cur, y)
	case syntax.SLASH:
		z, err = starlark.Binary(op, cur, y)
	default:
		z, err = binopGuard(op)(th, st, starlark.Tuple{cur, y}, nil)
	}
	if err != nil {
		return nil, err
	}
	return starlark.None, setIndex(a, i, z)
}

var augOps = func() map[string]syntax.Token {
	m := map[string]syntax.Token{syntax.SLASH.String(): syntax.SLASH}
	for op := range binopGuards {
		m[op.String()] = op
	}
	return m
}()

// dictGuard charges for a dict a literal or comprehension made.
func dictGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	d := args[0].(*starlark.Dict)
	if err := st.mem.charge(tableBytes+entryBytes*int64(d.Len()), "a dict"); err != nil {
		return nil, err
	}
	return d, nil
}

// ---- indexing and slicing ----

// maxKeyText bounds the text of a key an error message prints.
const maxKeyText = 1 << 10

func indexGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	return getIndex(st, args[0], args[1])
}

// getIndex is the interpreter's x[y], except that a missing key's message
// prints at most maxKeyText bytes of it.
func getIndex(st *starThread, x, y starlark.Value) (starlark.Value, error) {
	switch x := x.(type) {
	case starlark.Mapping:
		if err := lookupCheck(st, "[key]", x, nil, x, y); err != nil {
			return nil, err
		}
		z, found, err := x.Get(y)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("key %s not in %s", keyText(y), x.Type())
		}
		return z, nil
	case starlark.Indexable:
		n := x.Len()
		i, err := starlark.AsInt32(y)
		if err != nil {
			return nil, fmt.Errorf("%s index: %s", x.Type(), err)
		}
		orig := i
		if i < 0 {
			i += n
		}
		if i < 0 || i >= n {
			return nil, outOfRange(orig, n, x)
		}
		return x.Index(i), nil
	}
	return nil, fmt.Errorf("unhandled index operation %s[%s]", x.Type(), y.Type())
}

// setIndex is the interpreter's x[y] = z.
func setIndex(x, y, z starlark.Value) error {
	switch x := x.(type) {
	case starlark.HasSetKey:
		return x.SetKey(y, z)
	case starlark.HasSetIndex:
		n := x.Len()
		i, err := starlark.AsInt32(y)
		if err != nil {
			return err
		}
		orig := i
		if i < 0 {
			i += n
		}
		if i < 0 || i >= n {
			return outOfRange(orig, n, x)
		}
		return x.SetIndex(i, z)
	}
	return fmt.Errorf("%s value does not support item assignment", x.Type())
}

func outOfRange(i, n int, x starlark.Value) error {
	if n == 0 {
		return fmt.Errorf("index %d out of range: empty %s", i, x.Type())
	}
	return fmt.Errorf("%s index %d out of range [%d:%d]", x.Type(), i, -n, n-1)
}

// keyText is y as the interpreter prints it, if that is short.
func keyText(y starlark.Value) string {
	if n, err := reprLen(y, maxKeyText); err == nil && n <= maxKeyText {
		return y.String()
	}
	return fmt.Sprintf("(a %s longer than %d bytes as text)", y.Type(), maxKeyText)
}

// keyGuard passes a dict literal's key through, having accounted its hash
// and checked that the message of a duplicate key, which prints it, fits
// in the budget.
func keyGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	k := args[0]
	if err := keyCheck(st, "a dict key", nil, nil, k); err != nil {
		return nil, err
	}
	if _, ok := k.(starlark.String); ok && 4*int64(len(k.(starlark.String))) < st.mem.room() {
		return k, nil // the common case, without measuring
	}
	n, err := reprLen(k, st.mem.room())
	if err != nil {
		return nil, err
	}
	if n > st.mem.room() {
		return nil, st.mem.refuse("a dict key's text", n)
	}
	return k, nil
}

// sliceGuard is the interpreter's x[lo:hi:step].
func sliceGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	x, lo, hi, stepV := args[0], args[1], args[2], args[3]
	s, ok := x.(starlark.Sliceable)
	if !ok {
		return nil, fmt.Errorf("invalid slice operand %s", x.Type())
	}
	n := s.Len()
	step := 1
	if stepV != starlark.None {
		var err error
		if step, err = starlark.AsInt32(stepV); err != nil {
			return nil, fmt.Errorf("invalid slice step: %s", err)
		}
		if step == 0 {
			return nil, fmt.Errorf("zero is not a valid slice step")
		}
	}
	var start, end int
	if step > 0 {
		start, end = 0, n
		if err := asIndex(lo, n, &start); err != nil {
			return nil, fmt.Errorf("invalid start index: %s", err)
		}
		start = min(max(start, 0), n)
		if err := asIndex(hi, n, &end); err != nil {
			return nil, fmt.Errorf("invalid end index: %s", err)
		}
		end = min(max(end, 0), n)
		end = max(end, start)
	} else {
		start, end = n-1, -1
		if err := asIndex(lo, n, &start); err != nil {
			return nil, fmt.Errorf("invalid start index: %s", err)
		}
		start = min(start, n-1)
		if err := asIndex(hi, n, &end); err != nil {
			return nil, fmt.Errorf("invalid end index: %s", err)
		}
		end = max(end, -1)
		start = max(start, end)
	}
	var count int64
	if step > 0 {
		count = int64((end - start + step - 1) / step)
	} else {
		count = int64((start - end - step - 1) / -step)
	}
	var bytes int64
	switch x.(type) {
	case starlark.String, starlark.Bytes:
		if step != 1 {
			bytes = strBytes + 2*count // appended a byte at a time
		}
	case *starlark.List:
		bytes = listBytes + slotBytes*count
		if step != 1 {
			bytes += slotBytes * count
		}
	case starlark.Tuple:
		if step != 1 {
			bytes = tupleBytes + 2*slotBytes*count
		}
	}
	if err := st.mem.charge(bytes, "a slice"); err != nil {
		return nil, err
	}
	return s.Slice(start, end, step), nil
}

// asIndex is the interpreter's: v, if not None, as an index, counted from
// the end if negative.
func asIndex(v starlark.Value, n int, result *int) error {
	if v == starlark.None {
		return nil
	}
	i, err := starlark.AsInt32(v)
	if err != nil {
		return err
	}
	if i < 0 {
		i += n
	}
	*result = i
	return nil
}

// ---- calls ----

// starArgsGuard charges for the copies of f(*xs): the positional
// arguments, and a Starlark callee's *args tuple.
func starArgsGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	if err := st.mem.charge(3*slotBytes*max(0, lengthOf(args[0])), "*args"); err != nil {
		return nil, err
	}
	return args[0], nil
}

// kwArgsGuard charges for the copies of f(**kw): its items, and a
// Starlark callee's **kwargs dict.
func kwArgsGuard(_ *starlark.Thread, st *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	if m, ok := args[0].(starlark.IterableMapping); ok {
		if err := st.mem.charge((pairBytes+slotBytes+entryBytes)*int64(max(0, starlark.Len(m))), "**kwargs"); err != nil {
			return nil, err
		}
	}
	return args[0], nil
}

// ---- methods ----

// methodEstimate estimates what calling method name of recv with args
// allocates; 0 for a receiver whose method of that name does not.
type methodEstimate func(st *starThread, recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error)

// guardedMethods are the methods of the built-in types whose result can
// grow by more than a constant per call. The others (append, get, pop,
// find, strip, partition, elems, ...) allocate a constant or return parts
// of their receiver.
var guardedMethods = map[string]methodEstimate{
	"capitalize":           caseBytes,
	"lower":                caseBytes,
	"upper":                caseBytes,
	"title":                caseBytes,
	"format":               formatBytes,
	"join":                 joinBytes,
	"replace":              replaceBytes,
	"split":                splitBytes,
	"rsplit":               splitBytes,
	"splitlines":           splitlinesBytes,
	"extend":               extendBytes,
	"items":                dictViewBytes,
	"keys":                 dictViewBytes,
	"values":               dictViewBytes,
	"update":               updateBytes,
	"union":                setOpBytes,
	"intersection":         setOpBytes,
	"difference":           setOpBytes,
	"symmetric_difference": setOpBytes,
	"issubset":             setOpBytes,
	"issuperset":           setOpBytes,
}

// methodWork accounts the hashing and comparing that calling method name
// of recv with args does (memory.go); nothing for a receiver whose method
// of that name does neither.
type methodWork func(w *workMeter, recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple) error

// workMethods are the methods of the built-in types that hash or compare
// their arguments: the dict and set methods that look a key up or store
// it, and list.index and list.remove, which compare each element with
// their argument; and set.issubset, which looks up each element of its
// argument. (dict.popitem and set.pop hash a key the receiver holds,
// which was accounted when it was stored.) The dict and set methods that
// look up or store many keys are tableMethods.
var workMethods = map[string]methodWork{
	"get":        keyArgWork,
	"pop":        keyArgWork,
	"setdefault": keyArgWork,
	"add":        keyArgWork,
	"discard":    keyArgWork,
	"remove":     keyArgWork,
	"index":      keyArgWork,
	"issubset":   issubsetWork,
}

// tableMethod is a dict or set method that looks up or stores many keys,
// done by the guards a key at a time (memory.go, "Collisions"); m is the
// interpreter's, bound to its receiver, which names the errors.
type tableMethod func(w *workMeter, m *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)

// tableMethods are the dict and set methods done a key at a time, for a
// receiver of those types.
var tableMethods = map[string]tableMethod{
	"update":               tableUpdate,
	"union":                setUnion,
	"intersection":         setWithOther,
	"difference":           setWithOther,
	"symmetric_difference": setWithOther,
	"issuperset":           setWithOther,
}

// isGuardedMethod reports whether a method of that name is called
// through a guard: if it allocates or hashes or compares, for some
// receiver.
func isGuardedMethod(name string) bool {
	if _, ok := guardedMethods[name]; ok {
		return true
	}
	if _, ok := tableMethods[name]; ok {
		return true
	}
	_, ok := workMethods[name]
	return ok
}

// callMethod calls method name of recv, having charged its estimate and
// accounted its hashing and comparing.
func callMethod(th *starlark.Thread, st *starThread, recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m, err := method(recv, name)
	if err != nil {
		return nil, err
	}
	if est, ok := guardedMethods[name]; ok {
		n, err := est(st, recv, name, args, kwargs)
		if err == nil {
			err = st.mem.charge(n, "."+name+"()")
		}
		if err != nil {
			return nil, st.mem.note(err)
		}
	}
	if table, ok := tableMethods[name]; ok && tableLike(recv) {
		w := st.meter(name, recv, nil)
		w.method = true
		v, err := table(&w, m.(*starlark.Builtin), args, kwargs)
		if err != nil {
			return nil, err
		}
		return v, w.done()
	}
	if work, ok := workMethods[name]; ok {
		w := st.meter(name, recv, nil)
		w.method = true
		err := work(&w, recv, name, args, kwargs)
		if err == nil {
			err = w.done()
		}
		if err != nil {
			return nil, err
		}
	}
	return m.CallInternal(th, args, kwargs)
}

// tableLike reports whether x is a dict or a set.
func tableLike(x starlark.Value) bool {
	switch x.(type) {
	case *starlark.Dict, *starlark.Set:
		return true
	}
	return false
}

// keyArgWork accounts a dict or set method that looks up or stores its
// first argument (get, pop, setdefault, add, discard, remove), and
// list.index and list.remove, which compare it with each element.
func keyArgWork(w *workMeter, recv starlark.Value, name string, args starlark.Tuple, _ []starlark.Tuple) error {
	if len(args) == 0 {
		return nil // the method reports it
	}
	switch recv := recv.(type) {
	case *starlark.Dict, *starlark.Set:
		_, err := w.lookupOne(recv, args[0])
		return err
	case *starlark.List:
		if name != "index" && name != "remove" || cheapOperand(args[0]) {
			return nil
		}
		// All elements, whatever the bounds of index say.
		for i := range recv.Len() {
			if err := w.compare(syntax.EQL, recv.Index(i), args[0]); err != nil {
				return err
			}
		}
	}
	return nil
}

// issubsetWork accounts set.issubset, which looks each element of its
// argument up in the receiver (comparing it with every entry of its hash,
// found or not: hashtable.go's count), up to the first unhashable one;
// and the receiver's own keys.
func issubsetWork(w *workMeter, recv starlark.Value, _ string, args starlark.Tuple, _ []starlark.Tuple) error {
	s, ok := recv.(*starlark.Set)
	if !ok {
		return nil
	}
	for e := range s.Elements() {
		if _, err := w.key(e); err != nil {
			return err
		}
	}
	for _, a := range args {
		it, ok := a.(starlark.Iterable)
		if !ok {
			continue
		}
		if err := func() error {
			iter := it.Iterate()
			defer iter.Done()
			var k starlark.Value
			for iter.Next(&k) {
				if err := w.st.interrupted(); err != nil {
					return err
				}
				if hashable, err := w.lookup(s, k); err != nil || !hashable {
					return err
				}
			}
			return nil
		}(); err != nil {
			return err
		}
	}
	return nil
}

func method(recv starlark.Value, name string) (starlark.Callable, error) {
	if ha, ok := recv.(starlark.HasAttrs); ok {
		m, err := ha.Attr(name)
		if err != nil {
			return nil, err
		}
		if c, ok := m.(starlark.Callable); ok {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%s has no .%s field or method", recv.Type(), name)
}

// boundGuards are the guarded methods as values (x.join without the call),
// bound to their receiver with BindReceiver.
var boundGuards = func() map[string]*starlark.Builtin {
	m := map[string]*starlark.Builtin{}
	bind := func(name string) {
		m[name] = starlark.NewBuiltin(name, func(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return callMethod(th, starOf(th), b.Receiver(), name, args, kwargs)
		})
	}
	for name := range guardedMethods {
		bind(name)
	}
	for name := range workMethods {
		bind(name)
	}
	return m
}()

// attrGuard is x.name for a guarded method name: the method, guarded.
func attrGuard(_ *starlark.Thread, _ *starThread, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	x, name := args[0], string(args[1].(starlark.String))
	if !hasMethod(x, name) {
		if _, err := method(x, name); err != nil {
			return nil, err
		}
	}
	return boundGuards[name].BindReceiver(x), nil
}

// builtinMethods are the names of the methods of the built-in types that
// have guarded methods, known without looking one up (which allocates it).
var builtinMethods = map[string]map[string]bool{}

func init() {
	for _, x := range []starlark.HasAttrs{new(starlark.Dict), new(starlark.List), new(starlark.Set), starlark.String(""), starlark.Bytes("")} {
		names := map[string]bool{}
		for _, name := range x.AttrNames() {
			names[name] = true
		}
		builtinMethods[x.Type()] = names
	}
}

// hasMethod reports whether x, a value of a built-in type, has a method
// name; false if it has not or if x is of another type.
func hasMethod(x starlark.Value, name string) bool {
	switch x.(type) {
	case *starlark.Dict, *starlark.List, *starlark.Set, starlark.String, starlark.Bytes:
		return builtinMethods[x.Type()][name]
	}
	return false
}

func guardedGetattr(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) >= 2 && len(kwargs) == 0 {
		if name, ok := args[1].(starlark.String); ok {
			if isGuardedMethod(string(name)) {
				if _, err := method(args[0], string(name)); err == nil {
					return boundGuards[string(name)].BindReceiver(args[0]), nil
				}
			}
		}
	}
	return starlark.Universe["getattr"].(*starlark.Builtin).CallInternal(th, args, kwargs)
}

func caseBytes(_ *starThread, recv starlark.Value, _ string, _ starlark.Tuple, _ []starlark.Tuple) (int64, error) {
	s, ok := recv.(starlark.String)
	if !ok {
		return 0, nil
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			// A rune can change length with its case, and an invalid
			// byte becomes U+FFFD: three bytes at most for one.
			return strBytes + 3*int64(len(s)), nil
		}
	}
	return strBytes + int64(len(s)), nil
}

func formatBytes(st *starThread, recv starlark.Value, _ string, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
	s, ok := recv.(starlark.String)
	if !ok {
		return 0, nil
	}
	n, err := formatLen(string(s), args, kwargs, st.mem.room())
	return strBytes + mulSat(2, n), err
}

func joinBytes(_ *starThread, recv starlark.Value, _ string, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
	sep, ok := recv.(starlark.String)
	if !ok || len(args) != 1 {
		return 0, nil
	}
	it, ok := args[0].(starlark.Iterable)
	if !ok {
		return 0, nil
	}
	var n, count int64
	iter := it.Iterate()
	defer iter.Done()
	var x starlark.Value
	for iter.Next(&x) {
		if s, ok := x.(starlark.String); ok {
			n = addSat(n, int64(len(s)))
		}
		count++
	}
	if count > 1 {
		n = addSat(n, mulSat(int64(len(sep)), count-1))
	}
	return strBytes + mulSat(2, n), nil // a builder that grows by doubling
}

func replaceBytes(_ *starThread, recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
	s, ok := recv.(starlark.String)
	if !ok {
		return 0, nil
	}
	var old, new string
	count := -1
	if err := starlark.UnpackPositionalArgs(name, args, kwargs, 2, &old, &new, &count); err != nil {
		return 0, nil // the method reports it
	}
	var occ int
	if old == "" {
		occ = utf8.RuneCountInString(string(s)) + 1
	} else {
		occ = strings.Count(string(s), old)
	}
	if count >= 0 {
		occ = min(occ, count)
	}
	if occ == 0 {
		return 0, nil
	}
	return addSat(strBytes+int64(len(s)), mulSat(int64(occ), int64(max(0, len(new)-len(old))))), nil
}

// Each piece of a split: its string in the Go result, its slot in the
// list and its boxed header.
const pieceBytes = 3 * slotBytes

func splitBytes(_ *starThread, recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
	s, ok := recv.(starlark.String)
	if !ok {
		return 0, nil
	}
	var sepV starlark.Value
	maxsplit := -1
	if err := starlark.UnpackPositionalArgs(name, args, kwargs, 0, &sepV, &maxsplit); err != nil {
		return 0, nil
	}
	var pieces, extra int64
	if sep, ok := sepV.(starlark.String); ok && sep != "" {
		pieces = int64(strings.Count(string(s), string(sep))) + 1
		if maxsplit >= 0 {
			if name == "split" {
				pieces = min(pieces, int64(maxsplit)+1)
			} else {
				extra = int64(len(s)) // rsplit splits all, then joins the excess
			}
		}
	} else {
		pieces = fieldCount(string(s))
	}
	return listBytes + pieceBytes*pieces + extra, nil
}

// fieldCount is len(strings.Fields(s)).
func fieldCount(s string) int64 {
	var n int64
	inField := false
	for _, r := range s {
		space := unicode.IsSpace(r)
		if !space && !inField {
			n++
		}
		inField = !space
	}
	return n
}

func splitlinesBytes(_ *starThread, recv starlark.Value, _ string, _ starlark.Tuple, _ []starlark.Tuple) (int64, error) {
	s, ok := recv.(starlark.String)
	if !ok || s == "" {
		return 0, nil
	}
	return listBytes + pieceBytes*(int64(strings.Count(string(s), "\n"))+1), nil
}

func extendBytes(_ *starThread, recv starlark.Value, _ string, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
	if _, ok := recv.(*starlark.List); !ok || len(args) != 1 {
		return 0, nil
	}
	return 2 * slotBytes * max(0, lengthOf(args[0])), nil
}

func dictViewBytes(_ *starThread, recv starlark.Value, name string, _ starlark.Tuple, _ []starlark.Tuple) (int64, error) {
	d, ok := recv.(*starlark.Dict)
	if !ok {
		return 0, nil
	}
	each := int64(slotBytes)
	if name == "items" {
		each += pairBytes
	}
	return listBytes + each*int64(d.Len()), nil
}

func updateBytes(_ *starThread, recv starlark.Value, _ string, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
	var n int64
	switch recv.(type) {
	case *starlark.Dict:
		for _, a := range args {
			// A mapping's items are copied; pairs from an iterable each
			// leave a deferred call until the update ends.
			n = addSat(n, mulSat(2*entryBytes+pairBytes, max(0, lengthOf(a))))
		}
		n = addSat(n, entryBytes*int64(len(kwargs)))
	case *starlark.Set:
		for _, a := range args {
			n = addSat(n, mulSat(entryBytes, max(0, lengthOf(a))))
		}
	}
	return n, nil
}

func setOpBytes(_ *starThread, recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
	s, ok := recv.(*starlark.Set)
	if !ok {
		return 0, nil
	}
	if name != "union" && len(args)+len(kwargs) == 0 {
		// The interpreter takes the argument for optional and
		// dereferences it: without one, it panics.
		return 0, fmt.Errorf("%s: got 0 arguments, want 1", name)
	}
	own := int64(s.Len())
	var others int64
	for _, a := range args {
		others = addSat(others, max(0, lengthOf(a)))
	}
	switch name {
	case "union", "symmetric_difference":
		return addSat(tableBytes, mulSat(entryBytes, addSat(own, others))), nil
	case "issubset":
		return tableBytes + 8*own, nil // a bitset per bucket
	case "issuperset":
		return 0, nil
	}
	return tableBytes + entryBytes*own, nil // intersection, difference: at most s
}

// ---- the universe ----

// universeEstimate estimates what a universe function allocates.
type universeEstimate func(st *starThread, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error)

// universeGuards are the universe's functions whose result grows with
// their arguments; predeclared shadows each with a guarded one of the same
// name. (getattr and print are replaced outright, fail by the ledger's.)
var universeGuards = map[string]universeEstimate{
	"list":      seqOf(listBytes, slotBytes),
	"reversed":  seqOf(listBytes, slotBytes),
	"sorted":    seqOf(listBytes, 2*slotBytes), // the list and, with key=, the keys
	"set":       seqOf(tableBytes, entryBytes),
	"enumerate": seqOf(listBytes, slotBytes+pairBytes),
	"tuple": func(st *starThread, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
		if len(args) == 1 {
			if _, ok := args[0].(starlark.Tuple); ok {
				return 0, nil
			}
		}
		return seqOf(tupleBytes, slotBytes)(st, args, kwargs)
	},
	"dict": func(st *starThread, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
		n, _ := updateBytes(st, &starlark.Dict{}, "dict", args, kwargs)
		return tableBytes + n, nil
	},
	"zip": func(_ *starThread, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
		if len(args) == 0 {
			return 0, nil
		}
		rows := int64(-1)
		for _, a := range args {
			if n := lengthOf(a); n >= 0 && (rows < 0 || n < rows) {
				rows = n
			}
		}
		return addSat(listBytes, mulSat(max(0, rows), slotBytes+tupleBytes+slotBytes*int64(len(args)))), nil
	},
	"str": func(st *starThread, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
		if len(args) != 1 {
			return 0, nil
		}
		switch x := args[0].(type) {
		case starlark.String:
			return 0, nil
		case starlark.Bytes:
			if utf8.ValidString(string(x)) {
				return 0, nil
			}
			return strBytes + 3*int64(len(x)), nil
		}
		return textBytes(st, args[0])
	},
	"repr": func(st *starThread, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
		if len(args) != 1 {
			return 0, nil
		}
		return textBytes(st, args[0])
	},
	"bytes": func(_ *starThread, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
		if len(args) != 1 {
			return 0, nil
		}
		switch x := args[0].(type) {
		case starlark.Bytes:
			return 0, nil
		case starlark.String:
			if utf8.ValidString(string(x)) {
				return 0, nil
			}
			return strBytes + 3*int64(len(x)), nil
		}
		return strBytes + 2*max(0, lengthOf(args[0])), nil
	},
	"int": func(_ *starThread, args starlark.Tuple, kwargs []starlark.Tuple) (int64, error) {
		if len(args) >= 1 {
			if s, ok := args[0].(starlark.String); ok && len(s) > 18 {
				// Bits a digit: 4 up to base 16 (and for base 0, which
				// reads 0x, 0o and 0b prefixes), 6 up to base 36.
				digit := int64(6)
				if base := 10; len(args) < 2 && len(kwargs) == 0 ||
					len(args) == 2 && starlark.AsInt(args[1], &base) == nil && base <= 16 {
					digit = 4
				}
				return intBytes(digit * int64(len(s)))
			}
		}
		return 0, nil
	},
	"abs": func(_ *starThread, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
		if len(args) == 1 {
			if x, ok := args[0].(starlark.Int); ok {
				return intBytes(intBits(x))
			}
		}
		return 0, nil
	},
}

// universeImpls replace the universe's functions that compare values,
// or build a set or a dict: the same functions, each comparison accounted
// first, each key stored a key at a time (memory.go, "Collisions"). orig
// is the universe's function, which names the errors.
var universeImpls = map[string]func(th *starlark.Thread, orig *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error){
	"sorted": guardedSorted,
	"min":    guardedMinMax,
	"max":    guardedMinMax,
	"set":    guardedSet,
	"dict":   guardedDict,
}

// guardedSorted is the universe's sorted (go.starlark.net's library.go,
// with the same arguments, errors and stable order), each call of its
// less function accounted. Once the accounting refuses, less answers
// false without comparing, and the sort ends quickly.
func guardedSorted(th *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var iterable starlark.Iterable
	var key starlark.Callable
	var reverse bool
	if err := starlark.UnpackArgs("sorted", args, kwargs,
		"iterable", &iterable,
		"key?", &key,
		"reverse?", &reverse,
	); err != nil {
		return nil, err
	}
	iter := iterable.Iterate()
	defer iter.Done()
	var values []starlark.Value
	if n := starlark.Len(iterable); n > 0 {
		values = make(starlark.Tuple, 0, n)
	}
	var x starlark.Value
	for iter.Next(&x) {
		values = append(values, x)
	}
	var keys []starlark.Value
	if key != nil {
		keys = make([]starlark.Value, len(values))
		for i, v := range values {
			k, err := starlark.Call(th, key, starlark.Tuple{v}, nil)
			if err != nil {
				return nil, err // to preserve backtrace, don't modify error
			}
			keys[i] = k
		}
	}
	slice := &sortSlice{keys: keys, values: values, w: starOf(th).meter("sorted()", nil, nil)}
	if reverse {
		sort.Stable(sort.Reverse(slice))
	} else {
		sort.Stable(slice)
	}
	if slice.refused != nil {
		return nil, slice.refused
	}
	if err := slice.w.done(); err != nil {
		return nil, err
	}
	return starlark.NewList(slice.values), slice.err
}

// sortSlice is library.go's, its comparisons accounted by w.
type sortSlice struct {
	keys    []starlark.Value // nil => values[i] is key
	values  []starlark.Value
	err     error
	w       workMeter
	refused error
}

func (s *sortSlice) Len() int { return len(s.values) }

func (s *sortSlice) Less(i, j int) bool {
	keys := s.keys
	if s.keys == nil {
		keys = s.values
	}
	if s.refused != nil {
		return false
	}
	if !cheapOperand(keys[i]) || !cheapOperand(keys[j]) {
		if err := s.w.compare(syntax.LT, keys[i], keys[j]); err != nil {
			s.refused = err
			return false
		}
	}
	ok, err := s.w.st.compare(syntax.LT, keys[i], keys[j])
	if errors.Is(err, errCancelled) {
		s.refused = err
		return false
	}
	if err != nil {
		s.err = err
	}
	return ok
}

func (s *sortSlice) Swap(i, j int) {
	if s.keys != nil {
		s.keys[i], s.keys[j] = s.keys[j], s.keys[i]
	}
	s.values[i], s.values[j] = s.values[j], s.values[i]
}

// guardedMinMax is the universe's min and max (library.go's minmax), each
// comparison accounted.
func guardedMinMax(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s requires at least one positional argument", b.Name())
	}
	var keyFunc starlark.Callable
	if err := starlark.UnpackArgs(b.Name(), nil, kwargs, "key?", &keyFunc); err != nil {
		return nil, err
	}
	op := syntax.LT
	if b.Name() == "max" {
		op = syntax.GT
	}
	var iterable starlark.Value
	if len(args) == 1 {
		iterable = args[0]
	} else {
		iterable = args
	}
	iter := starlark.Iterate(iterable)
	if iter == nil {
		return nil, fmt.Errorf("%s: %s value is not iterable", b.Name(), iterable.Type())
	}
	defer iter.Done()
	var extremum starlark.Value
	if !iter.Next(&extremum) {
		return nil, fmt.Errorf("%s: %v", b.Name(), "argument is an empty sequence")
	}
	var extremeKey starlark.Value
	var keyargs starlark.Tuple
	if keyFunc == nil {
		extremeKey = extremum
	} else {
		keyargs = starlark.Tuple{extremum}
		res, err := starlark.Call(th, keyFunc, keyargs, nil)
		if err != nil {
			return nil, err // to preserve backtrace, don't modify error
		}
		extremeKey = res
	}
	what := "min()"
	if b.Name() == "max" {
		what = "max()"
	}
	w := starOf(th).meter(what, nil, nil)
	var x starlark.Value
	for iter.Next(&x) {
		var key starlark.Value
		if keyFunc == nil {
			key = x
		} else {
			keyargs[0] = x
			res, err := starlark.Call(th, keyFunc, keyargs, nil)
			if err != nil {
				return nil, err // to preserve backtrace, don't modify error
			}
			key = res
		}
		if !cheapOperand(key) || !cheapOperand(extremeKey) {
			if err := w.compare(op, key, extremeKey); err != nil {
				return nil, err
			}
		}
		if ok, err := w.st.compare(op, key, extremeKey); errors.Is(err, errCancelled) {
			return nil, err
		} else if err != nil {
			return nil, fmt.Errorf("%s: %v", b.Name(), err)
		} else if ok {
			extremum = x
			extremeKey = key
		}
	}
	if err := w.done(); err != nil {
		return nil, err
	}
	return extremum, nil
}

// seqOf estimates a function building a collection of base bytes and each
// bytes per element of its first argument.
func seqOf(base, each int64) universeEstimate {
	return func(_ *starThread, args starlark.Tuple, _ []starlark.Tuple) (int64, error) {
		if len(args) == 0 {
			return base, nil
		}
		return addSat(base, mulSat(each, max(0, lengthOf(args[0])))), nil
	}
}

// textBytes estimates x's text (repr), built in a doubling builder.
func textBytes(st *starThread, x starlark.Value) (int64, error) {
	n, err := reprLen(x, st.mem.room()/2+1)
	return strBytes + mulSat(2, n), err
}

// ---- formatting ----

// interpolateLen bounds the length of format % x, mirroring the
// interpreter's interpolate; where that would fail it stops counting.
func interpolateLen(format string, x starlark.Value, limit int64) (int64, error) {
	var n int64
	index := 0
	tuple, isTuple := x.(starlark.Tuple)
	for n <= limit {
		i := strings.IndexByte(format, '%')
		if i < 0 {
			return addSat(n, int64(len(format))), nil
		}
		n += int64(i)
		format = format[i+1:]
		if format != "" && format[0] == '%' {
			n++
			format = format[1:]
			continue
		}
		var arg starlark.Value
		if format != "" && format[0] == '(' {
			j := strings.IndexByte(format, ')')
			m, ok := x.(starlark.Mapping)
			if j < 0 || !ok {
				return n, nil
			}
			v, found, _ := m.Get(starlark.String(format[1:j]))
			if !found {
				return n, nil
			}
			arg = v
			format = format[j+1:]
		} else {
			switch {
			case isTuple && index < len(tuple):
				arg = tuple[index]
			case !isTuple && index == 0:
				arg = x
			default:
				return n, nil
			}
		}
		if format == "" {
			return n, nil
		}
		var k int64
		var err error
		switch format[0] {
		case 's':
			k, err = sText(arg, limit-n)
		case 'r':
			k, err = reprLen(arg, limit-n)
		case 'd', 'i', 'o', 'x', 'X':
			if v, ok := arg.(starlark.Int); ok {
				k = intBits(v)/3 + 2 // octal is the longest
			} else {
				k = 400 // a float's integer part: 1024 bits at most
			}
		case 'e', 'f', 'g', 'E', 'F', 'G':
			k = 330 // %f of the largest double
		case 'c':
			k = utf8.UTFMax
		default:
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n = addSat(n, k)
		format = format[1:]
		index++
	}
	return n, nil
}

// sText is the length of what %s and {} write: a string as it is, anything
// else as its repr.
func sText(x starlark.Value, limit int64) (int64, error) {
	if s, ok := x.(starlark.String); ok {
		return int64(len(s)), nil
	}
	return reprLen(x, limit)
}

// formatLen bounds the length of format.format(*args, **kwargs), mirroring
// the interpreter's string·format; where that would fail it stops.
func formatLen(format string, args starlark.Tuple, kwargs []starlark.Tuple, limit int64) (int64, error) {
	n := int64(0)
	index := 0
	for n <= limit {
		i := strings.IndexByte(format, '{')
		if i < 0 {
			return addSat(n, int64(len(format))), nil
		}
		n += int64(i)
		if i+1 < len(format) && format[i+1] == '{' {
			n++
			format = format[i+2:]
			continue
		}
		format = format[i+1:]
		j := strings.IndexByte(format, '}')
		if j < 0 {
			return n, nil
		}
		field := format[:j]
		format = format[j+1:]
		name, conv := field, "s"
		if k := strings.IndexByte(field, '!'); k >= 0 {
			name, conv = field[:k], field[k+1:]
		}
		if k := strings.IndexByte(name, ':'); k >= 0 {
			name = name[:k]
		}
		var arg starlark.Value
		if name == "" {
			if index >= len(args) {
				return n, nil
			}
			arg = args[index]
			index++
		} else if num, ok := decimal(name); ok {
			if num >= len(args) {
				return n, nil
			}
			arg = args[num]
		} else {
			for _, kv := range kwargs {
				if string(kv[0].(starlark.String)) == name {
					arg = kv[1]
					break
				}
			}
			if arg == nil {
				return n, nil
			}
		}
		var k int64
		var err error
		if conv == "r" {
			k, err = reprLen(arg, limit-n)
		} else {
			k, err = sText(arg, limit-n)
		}
		if err != nil {
			return n, err
		}
		n = addSat(n, k)
	}
	return n, nil
}

func decimal(s string) (int, bool) {
	x := 0
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 {
			return 0, false
		}
		x = x*10 + int(d)
		if x < 0 {
			return 0, false
		}
	}
	return x, true
}
