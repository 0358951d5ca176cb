package ledger

import (
	"fmt"
	"strings"

	"go.starlark.net/syntax"
)

// The rewrite of a contract's syntax tree that puts every operation able
// to allocate more than a constant per step behind a guard, and every
// operation that hashes or compares values behind another (memory.go).
//
// It runs once, between parsing and compiling, and replaces:
//
//	x op y          for op in + - * // % | & ^ << >>   → __kiroku_<op>(x, y)
//	x op y          for op in == != < <= > >= in       → __kiroku_<eq, ne, lt, le, gt, ge, in>(x, y),
//	                                                      unless an operand is constant-shaped
//	x not in y                                         → not __kiroku_in(x, y), likewise
//	-x, ~x          (x not a literal)                   → __kiroku_neg(x), __kiroku_invert(x)
//	v op= y         (v a name)                          → v = __kiroku_<op>(v, y); += and |= keep
//	                                                      their in-place meaning for lists and dicts
//	a[i] op= y                                          → __kiroku_aug_index(__kiroku_item(a, i), "op", y)
//	x[lo:hi:step]                                       → __kiroku_slice(x, lo, hi, step)
//	x[i]            (i not a literal)                   → __kiroku_index(x, i)
//	x[k] = v        (also as a for or comprehension
//	                target; k not constant-shaped)      → x[__kiroku_hkey(k)] = v
//	{k1: v1, k2: v2, ...}                               → __kiroku_dict({__kiroku_key(k1): v1, ...}),
//	                                                      keys guarded if not constant-shaped
//	{k: v for ...}                                      → __kiroku_dict({__kiroku_hkey(k): v for ...})
//	f(*xs, **kw)                                        → f(*__kiroku_star(xs), **__kiroku_starstar(kw))
//	x.m             for the methods of guardedMethods    → __kiroku_attr(x, "m"), a guarded
//	                and workMethods                       method (then called, usually)
//
// and the universe's functions that allocate in proportion to their
// arguments (list, str, sorted, ...), or hash or compare them (set, dict,
// sorted, min, max), are shadowed by guarded versions in predeclared. a[i]
// and dict-literal keys are guarded also because a missing key's error
// message prints it, and a tuple holding many references to one long
// string prints enormous.
//
// Hashing and comparing happen, besides, inside operations guarded for
// their allocation: x | y, x & y, x ^ y, x - y and |= on sets and dicts
// (binopGuard, inplace), the methods that look up, store or search
// (get, pop, setdefault, update, add, discard, remove, index, union, ...)
// and the guards of a[i] and a[i] op= y. The sites the interpreter has
// (go.starlark.net's Compare, Equal and Hash, called from its EQL..GE and
// IN instructions, its dict and set operations and built-ins, and its
// hash table) are all reached from one of these, and each accounts the
// work before it runs — or, where it looks up or stores many keys (set(),
// dict(), update, union, |, the comparisons of dicts and sets, ...), does
// that work itself, a key at a time, accounting each lookup with the
// entries of its hash it compares (memory.go, "Collisions"). Where the
// rewrite leaves a comparison alone, an operand bounds its cost: it is
// constant-shaped — a literal, None, True or False, or a list, tuple or
// dict literal of such — or a call of a universal function whose result
// has no elements (len, type, str, ...; universalValues), the names not
// bound anywhere in the file. For in, that must be the left operand (and
// a few words at most), or the right one a string, or a list or tuple
// literal of constants: a dict on the right hashes the left whatever it
// is. dict.popitem and set.pop hash a key their receiver holds, accounted
// when it was stored; **kwargs, % with a mapping and hash() hash only
// strings. (A store x[k] = v, a dict literal's and a comprehension's keys
// are accounted as keys, not for their collisions: the guard does not see
// the table. Each is a step of its own.)
//
// A top-level v op= y that binds v first (in source order) is preceded by
// a binding of v that never runs, so that the resolver reads v there as
// the global, as it did. The dicts are charged because even an empty one
// holds half a kilobyte.
//
// The rewrite keeps the program's meaning, its error messages and its step
// count: each guard gives back the steps its call costs beyond the
// instructions it replaces (guardBuiltin's steps), so MaxSteps bounds what
// it bounded before. TestRewriteKeepsMeaning and FuzzRewriteKeepsMeaning
// compare rewritten and original programs. The differences: a failing
// program can fail a few steps later; the first top-level v op= y whose y
// reads v compiles (and fails when it runs) where it did not; hashing and
// comparing large values, and keys whose hashes collide, is charged steps
// (memory.go), which ordinary values are not; and the compiler pads the target address of each
// conditional jump with NOPs to four bytes, NOPs that take a step each
// when the jump falls through, so a jump to an address the larger,
// rewritten code moved past 127 (or 16383) takes a step fewer — never
// more. The names starting with guardPrefix are reserved: a contract that
// uses one does not compile.

// rewriter rewrites one file.
type rewriter struct {
	// depth is the nesting of functions (def, lambda) being rewritten.
	depth int
	// universal are the names of universalValues the file does not bind
	// anywhere: they name those values wherever they are used.
	universal map[string]bool
	// bound are the names bound at top level so far, in source order.
	// The dialect's GlobalReassign makes the resolver bind a top-level use
	// of a name when it meets it: to the global if one is bound above,
	// else to the predeclared or universal name, else it is an error.
	bound map[string]bool
}

// guardPrefix starts every name the rewrite introduces.
const guardPrefix = "__kiroku_"

// compareGuards names the guard of each binary operator that hashes or
// compares its operands (not in is rewritten as not __kiroku_in).
var compareGuards = map[syntax.Token]string{
	syntax.EQL: guardPrefix + "eq",
	syntax.NEQ: guardPrefix + "ne",
	syntax.LT:  guardPrefix + "lt",
	syntax.LE:  guardPrefix + "le",
	syntax.GT:  guardPrefix + "gt",
	syntax.GE:  guardPrefix + "ge",
	syntax.IN:  guardPrefix + "in",
}

// binopGuards names the guard of each binary operator that can allocate.
// Comparisons, in, and, or and / (whose result is a float) cannot.
var binopGuards = map[syntax.Token]string{
	syntax.PLUS:       guardPrefix + "plus",
	syntax.MINUS:      guardPrefix + "minus",
	syntax.STAR:       guardPrefix + "star_op",
	syntax.SLASHSLASH: guardPrefix + "floordiv",
	syntax.PERCENT:    guardPrefix + "percent",
	syntax.PIPE:       guardPrefix + "pipe",
	syntax.AMP:        guardPrefix + "amp",
	syntax.CIRCUMFLEX: guardPrefix + "xor",
	syntax.LTLT:       guardPrefix + "lshift",
	syntax.GTGT:       guardPrefix + "rshift",
}

// rewriteContract checks f for reserved names and rewrites it in place.
func rewriteContract(f *syntax.File) error {
	var err error
	syntax.Walk(f, func(n syntax.Node) bool {
		if id, ok := n.(*syntax.Ident); ok && strings.HasPrefix(id.Name, guardPrefix) && err == nil {
			err = fmt.Errorf("%s: the name %s is reserved", id.NamePos, id.Name)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	rw := &rewriter{bound: map[string]bool{}, universal: map[string]bool{}}
	for name := range universalValues {
		rw.universal[name] = true
	}
	for name := range bindings(f) {
		delete(rw.universal, name)
	}
	f.Stmts = rw.stmts(f.Stmts)
	return nil
}

// bindings returns the names f binds anywhere: assigned, iterated over,
// defined, taken as parameters or loaded.
func bindings(f *syntax.File) map[string]bool {
	names := map[string]bool{}
	var target func(e syntax.Expr)
	target = func(e syntax.Expr) {
		switch e := e.(type) {
		case *syntax.Ident:
			names[e.Name] = true
		case *syntax.ParenExpr:
			target(e.X)
		case *syntax.TupleExpr:
			for _, x := range e.List {
				target(x)
			}
		case *syntax.ListExpr:
			for _, x := range e.List {
				target(x)
			}
		}
	}
	params := func(ps []syntax.Expr) {
		for _, p := range ps {
			switch p := p.(type) {
			case *syntax.BinaryExpr: // name=default
				target(p.X)
			case *syntax.UnaryExpr: // *args, **kwargs
				if p.X != nil {
					target(p.X)
				}
			default:
				target(p)
			}
		}
	}
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.AssignStmt:
			target(n.LHS)
		case *syntax.ForStmt:
			target(n.Vars)
		case *syntax.ForClause:
			target(n.Vars)
		case *syntax.DefStmt:
			names[n.Name.Name] = true
			params(n.Params)
		case *syntax.LambdaExpr:
			params(n.Params)
		case *syntax.LoadStmt:
			for _, to := range n.To {
				names[to.Name] = true
			}
		}
		return true
	})
	return names
}

func (rw *rewriter) stmts(ss []syntax.Stmt) []syntax.Stmt {
	out := ss[:0:0]
	for _, s := range ss {
		out = append(out, rw.stmt(s)...)
	}
	return out
}

func (rw *rewriter) stmt(s syntax.Stmt) []syntax.Stmt {
	switch s := s.(type) {
	case *syntax.AssignStmt:
		return rw.assign(s)
	case *syntax.ExprStmt:
		s.X = rw.expr(s.X)
	case *syntax.IfStmt:
		s.Cond = rw.expr(s.Cond)
		s.True = rw.stmts(s.True)
		s.False = rw.stmts(s.False)
	case *syntax.ForStmt:
		s.X = rw.expr(s.X)
		s.Vars = rw.target(s.Vars)
		rw.bind(s.Vars)
		s.Body = rw.stmts(s.Body)
	case *syntax.WhileStmt:
		s.Cond = rw.expr(s.Cond)
		s.Body = rw.stmts(s.Body)
	case *syntax.ReturnStmt:
		if s.Result != nil {
			s.Result = rw.expr(s.Result)
		}
	case *syntax.DefStmt:
		rw.bind(s.Name)
		rw.params(s.Params)
		rw.depth++
		s.Body = rw.stmts(s.Body)
		rw.depth--
	case *syntax.LoadStmt:
		for _, to := range s.To {
			rw.bind(to)
		}
	}
	// BranchStmt: nothing to guard.
	return []syntax.Stmt{s}
}

// bind records the names target binds, if at top level.
func (rw *rewriter) bind(target syntax.Expr) {
	if rw.depth > 0 {
		return
	}
	switch t := target.(type) {
	case *syntax.Ident:
		rw.bound[t.Name] = true
	case *syntax.ParenExpr:
		rw.bind(t.X)
	case *syntax.TupleExpr:
		for _, x := range t.List {
			rw.bind(x)
		}
	case *syntax.ListExpr:
		for _, x := range t.List {
			rw.bind(x)
		}
	}
}

func (rw *rewriter) assign(s *syntax.AssignStmt) []syntax.Stmt {
	if s.Op == syntax.EQ {
		s.RHS = rw.expr(s.RHS)
		s.LHS = rw.target(s.LHS)
		rw.bind(s.LHS)
		return []syntax.Stmt{s}
	}
	op := s.Op - syntax.PLUS_EQ + syntax.PLUS // the binary operator
	rhs := rw.expr(s.RHS)
	switch lhs := unparen(s.LHS).(type) {
	case *syntax.Ident:
		// v op= y → v = guard(v, y): evaluating v twice has no effect.
		name := binopGuards[op]
		switch op {
		case syntax.PLUS:
			name = guardPrefix + "iadd"
		case syntax.PIPE:
			name = guardPrefix + "ipipe"
		case syntax.SLASH:
			s.RHS = rhs
			rw.bind(lhs)
			return []syntax.Stmt{s}
		}
		v := &syntax.Ident{NamePos: lhs.NamePos, Name: lhs.Name}
		out := []syntax.Stmt{&syntax.AssignStmt{OpPos: s.OpPos, Op: syntax.EQ, LHS: lhs, RHS: guardCall(s.OpPos, name, v, rhs)}}
		if rw.depth == 0 && !rw.bound[lhs.Name] {
			// v op= y binds v and reads that global, not the predeclared
			// v a top-level use of v would read above any binding of it.
			// Bind it first, without running anything (and without a
			// step: the guard gives back the three its if statement
			// takes, its name, its call and the conditional jump, which
			// is taken, past the else branch the compiler lays out
			// first, so that no padding of the jump runs either):
			//
			//	if __kiroku_bound():
			//	    pass
			//	else:
			//	    v = __kiroku_none
			bound := &syntax.IfStmt{If: s.OpPos, Cond: guardCall(s.OpPos, guardPrefix+"bound"),
				True: []syntax.Stmt{&syntax.BranchStmt{Token: syntax.PASS, TokenPos: s.OpPos}},
				False: []syntax.Stmt{&syntax.AssignStmt{OpPos: s.OpPos, Op: syntax.EQ,
					LHS: &syntax.Ident{NamePos: lhs.NamePos, Name: lhs.Name},
					RHS: &syntax.Ident{NamePos: s.OpPos, Name: guardPrefix + "none"}}}}
			out = append([]syntax.Stmt{bound}, out...)
		}
		rw.bind(lhs)
		return out
	case *syntax.IndexExpr:
		// a[i] op= y → __kiroku_aug_index(__kiroku_item(a, i), "op", y):
		// a and i evaluated once and a[i] read before y, as before; then
		// the operation and the store.
		opLit := &syntax.Literal{Token: syntax.STRING, TokenPos: s.OpPos, Raw: fmt.Sprintf("%q", op.String()), Value: op.String()}
		item := guardCall(lhs.Lbrack, guardPrefix+"item", rw.expr(lhs.X), rw.expr(lhs.Y))
		return []syntax.Stmt{&syntax.ExprStmt{X: guardCall(s.OpPos, guardPrefix+"aug_index", item, opLit, rhs)}}
	default:
		// x.f op= y: no built-in value has an assignable field, so the
		// operation fails (on a method value) before it allocates.
		s.LHS = rw.target(s.LHS)
		s.RHS = rhs
		return []syntax.Stmt{s}
	}
}

// target rewrites the expressions an assignment target evaluates, leaving
// the target itself assignable.
func (rw *rewriter) target(e syntax.Expr) syntax.Expr {
	switch e := e.(type) {
	case *syntax.ParenExpr:
		e.X = rw.target(e.X)
	case *syntax.TupleExpr:
		for i, x := range e.List {
			e.List[i] = rw.target(x)
		}
	case *syntax.ListExpr:
		for i, x := range e.List {
			e.List[i] = rw.target(x)
		}
	case *syntax.IndexExpr:
		e.X = rw.expr(e.X)
		cheap := rw.constShaped(e.Y)
		e.Y = rw.expr(e.Y)
		if !cheap {
			// x[k] = v hashes k if x is a dict.
			e.Y = guardCall(e.Lbrack, guardPrefix+"hkey", e.Y)
		}
	case *syntax.DotExpr:
		e.X = rw.expr(e.X)
	}
	return e
}

// params rewrites the default values of a function's parameters.
func (rw *rewriter) params(ps []syntax.Expr) {
	for _, p := range ps {
		if b, ok := p.(*syntax.BinaryExpr); ok && b.Op == syntax.EQ {
			b.Y = rw.expr(b.Y)
		}
	}
}

func (rw *rewriter) expr(e syntax.Expr) syntax.Expr {
	switch e := e.(type) {
	case *syntax.ParenExpr:
		e.X = rw.expr(e.X)
	case *syntax.BinaryExpr:
		return rw.binary(e)
	case *syntax.UnaryExpr:
		switch e.Op {
		case syntax.MINUS, syntax.TILDE:
			if _, lit := e.X.(*syntax.Literal); !lit {
				name := guardPrefix + "neg"
				if e.Op == syntax.TILDE {
					name = guardPrefix + "invert"
				}
				return guardCall(e.OpPos, name, rw.expr(e.X))
			}
		default:
			e.X = rw.expr(e.X)
		}
	case *syntax.CallExpr:
		return rw.callExpr(e)
	case *syntax.DotExpr:
		if isGuardedMethod(e.Name.Name) {
			name := &syntax.Literal{Token: syntax.STRING, TokenPos: e.Dot, Raw: fmt.Sprintf("%q", e.Name.Name), Value: e.Name.Name}
			return guardCall(e.Dot, guardPrefix+"attr", rw.expr(e.X), name)
		}
		e.X = rw.expr(e.X)
	case *syntax.IndexExpr:
		if constant(e.Y) {
			e.X = rw.expr(e.X)
			return e
		}
		return guardCall(e.Lbrack, guardPrefix+"index", rw.expr(e.X), rw.expr(e.Y))
	case *syntax.SliceExpr:
		part := func(x syntax.Expr) syntax.Expr {
			if x == nil {
				return &syntax.Ident{NamePos: e.Lbrack, Name: guardPrefix + "none"}
			}
			return rw.expr(x)
		}
		return guardCall(e.Lbrack, guardPrefix+"slice", rw.expr(e.X), part(e.Lo), part(e.Hi), part(e.Step))
	case *syntax.ListExpr:
		for i, x := range e.List {
			e.List[i] = rw.expr(x)
		}
	case *syntax.TupleExpr:
		for i, x := range e.List {
			e.List[i] = rw.expr(x)
		}
	case *syntax.DictExpr:
		for _, x := range e.List {
			entry := x.(*syntax.DictEntry)
			cheap := rw.constShaped(entry.Key)
			entry.Key = rw.expr(entry.Key)
			if !cheap {
				entry.Key = guardCall(entry.Colon, guardPrefix+"key", entry.Key)
			}
			entry.Value = rw.expr(entry.Value)
		}
		// Even an empty dict holds a bucket of eight entries: half a
		// kilobyte a step, if kept, unless charged.
		return guardCall(e.Lbrace, guardPrefix+"dict", e)
	case *syntax.CondExpr:
		e.Cond = rw.expr(e.Cond)
		e.True = rw.expr(e.True)
		e.False = rw.expr(e.False)
	case *syntax.Comprehension:
		for _, c := range e.Clauses {
			switch c := c.(type) {
			case *syntax.ForClause:
				c.Vars = rw.target(c.Vars)
				c.X = rw.expr(c.X)
			case *syntax.IfClause:
				c.Cond = rw.expr(c.Cond)
			}
		}
		if entry, ok := e.Body.(*syntax.DictEntry); ok {
			cheap := rw.constShaped(entry.Key)
			entry.Key = rw.expr(entry.Key)
			if !cheap {
				entry.Key = guardCall(entry.Colon, guardPrefix+"hkey", entry.Key)
			}
			entry.Value = rw.expr(entry.Value)
			return guardCall(e.Lbrack, guardPrefix+"dict", e)
		}
		e.Body = rw.expr(e.Body)
	case *syntax.LambdaExpr:
		rw.params(e.Params)
		rw.depth++
		e.Body = rw.expr(e.Body)
		rw.depth--
	}
	// Ident, Literal: nothing to guard.
	return e
}

// binary guards a binary expression. A chain of + is rewritten as the
// compiler sees it: flattened, with adjacent string, bytes, list and
// tuple literals folded into one (the compiler folds them; their size is
// the source's), so that the step count stays the same.
func (rw *rewriter) binary(e *syntax.BinaryExpr) syntax.Expr {
	if e.Op == syntax.NOT_IN || compareGuards[e.Op] != "" {
		return rw.compare(e)
	}
	name, guarded := binopGuards[e.Op]
	if !guarded {
		e.X = rw.expr(e.X)
		e.Y = rw.expr(e.Y)
		return e
	}
	if e.Op != syntax.PLUS {
		return guardCall(e.OpPos, name, rw.expr(e.X), rw.expr(e.Y))
	}
	type summand struct {
		x   syntax.Expr
		pos syntax.Position
	}
	var args []summand
	for plus := e; ; {
		args = append(args, summand{unparen(plus.Y), plus.OpPos})
		left, ok := unparen(plus.X).(*syntax.BinaryExpr)
		if !ok || left.Op != syntax.PLUS {
			args = append(args, summand{x: unparen(plus.X)})
			break
		}
		plus = left
	}
	for i, j := 0, len(args)-1; i < j; i, j = i+1, j-1 {
		args[i], args[j] = args[j], args[i]
	}
	for i := range args {
		// In place: a literal list's or tuple's elements are rewritten
		// where they are (the same nodes fold below, and stay in e).
		args[i].x = rw.expr(args[i].x)
	}
	var out []summand
	for i := 0; i < len(args); {
		j := i + 1
		if code := addable(args[i].x); code != 0 {
			for j < len(args) && addable(args[j].x) == code {
				j++
			}
			if j > i+1 {
				xs := make([]syntax.Expr, j-i)
				for k := range xs {
					xs[k] = args[i+k].x
				}
				args[i].x = fold(code, xs)
			}
		}
		out = append(out, summand{args[i].x, args[i].pos})
		i = j
	}
	if len(out) == 1 {
		// A sum of literals alone: the compiler folds it as it is. (Not
		// the folded node: a string literal on its own as a statement
		// would read as a docstring, and not run.)
		return e
	}
	sum := out[0].x
	for _, s := range out[1:] {
		sum = guardCall(s.pos, name, sum, s.x)
	}
	return sum
}

// universalValues are the universe's constants, and its functions whose
// result has no elements: true for those whose result is, besides, a few
// words at most (not a string of any length, nor an integer of any size).
var universalValues = map[string]bool{
	"None": true, "True": true, "False": true,
	"len": true, "hash": true, "ord": true, "bool": true, "type": true, "chr": true,
	"int": false, "float": false, "abs": false, "str": false, "repr": false,
}

// compare guards a comparison, in or not in, unless an operand bounds
// its cost: x == "a", k in ("a", "b"), v != None, len(x) > n.
func (rw *rewriter) compare(e *syntax.BinaryExpr) syntax.Expr {
	var cheap bool
	if e.Op == syntax.IN || e.Op == syntax.NOT_IN {
		// x in y compares x with each element of a list or tuple y:
		// cheap if x is small; a dict or set y hashes x, whatever it is;
		// a string y holds strings.
		cheap = rw.constShaped(e.X) || rw.leafCall(e.X, true)
		switch y := unparen(e.Y).(type) {
		case *syntax.Literal:
			cheap = cheap || y.Token == syntax.STRING || y.Token == syntax.BYTES
		case *syntax.ListExpr, *syntax.TupleExpr:
			cheap = cheap || rw.constShaped(y)
		case *syntax.CallExpr:
			if fn, ok := y.Fn.(*syntax.Ident); ok && (fn.Name == "str" || fn.Name == "repr") {
				cheap = cheap || rw.leafCall(y, false)
			}
		}
	} else {
		// One comparison: cheap if either operand has no elements, or
		// is bounded by the source.
		cheap = rw.constShaped(e.X) || rw.constShaped(e.Y) || rw.leafCall(e.X, false) || rw.leafCall(e.Y, false)
	}
	e.X = rw.expr(e.X)
	e.Y = rw.expr(e.Y)
	if cheap {
		return e
	}
	if e.Op == syntax.NOT_IN {
		// not __kiroku_in(x, y): the compiler makes x not in y IN and
		// NOT, or IN alone in a condition (jumping the other way), and
		// does the same with not and a call.
		return &syntax.UnaryExpr{OpPos: e.OpPos, Op: syntax.NOT, X: guardCall(e.OpPos, compareGuards[syntax.IN], e.X, e.Y)}
	}
	return guardCall(e.OpPos, compareGuards[e.Op], e.X, e.Y)
}

// constShaped reports whether e is a literal, None, True or False, or a
// list, tuple or dict literal of such, possibly signed or parenthesized:
// a value whose hashing and comparing with anything costs no more than
// the source says.
func (rw *rewriter) constShaped(e syntax.Expr) bool {
	switch e := unparen(e).(type) {
	case *syntax.Literal:
		return true
	case *syntax.Ident:
		return rw.universal[e.Name] && (e.Name == "None" || e.Name == "True" || e.Name == "False")
	case *syntax.UnaryExpr:
		return (e.Op == syntax.MINUS || e.Op == syntax.PLUS) && constant(e)
	case *syntax.ListExpr:
		for _, x := range e.List {
			if !rw.constShaped(x) {
				return false
			}
		}
		return true
	case *syntax.TupleExpr:
		for _, x := range e.List {
			if !rw.constShaped(x) {
				return false
			}
		}
		return true
	case *syntax.DictExpr:
		for _, x := range e.List {
			entry := x.(*syntax.DictEntry)
			if !rw.constShaped(entry.Key) || !rw.constShaped(entry.Value) {
				return false
			}
		}
		return true
	}
	return false
}

// leafCall reports whether e calls a universal function whose result has
// no elements (universalValues), and, if small, is a few words at most.
func (rw *rewriter) leafCall(e syntax.Expr, small bool) bool {
	call, ok := unparen(e).(*syntax.CallExpr)
	if !ok {
		return false
	}
	fn, ok := call.Fn.(*syntax.Ident)
	if !ok || !rw.universal[fn.Name] {
		return false
	}
	fewWords, ok := universalValues[fn.Name]
	return ok && fn.Name != "None" && fn.Name != "True" && fn.Name != "False" && (fewWords || !small)
}

// addable and fold mirror the compiler's folding of literal sums
// (go.starlark.net/internal/compile): "a" + "b", b"a" + b"b", [x] + [y],
// (x,) + (y,).
func addable(e syntax.Expr) rune {
	switch e := e.(type) {
	case *syntax.Literal:
		switch e.Token {
		case syntax.STRING:
			return 's'
		case syntax.BYTES:
			return 'b'
		}
	case *syntax.ListExpr:
		return 'l'
	case *syntax.TupleExpr:
		return 't'
	}
	return 0
}

func fold(code rune, xs []syntax.Expr) syntax.Expr {
	switch code {
	case 's', 'b':
		var buf strings.Builder
		for _, x := range xs {
			buf.WriteString(x.(*syntax.Literal).Value.(string))
		}
		tok := syntax.STRING
		if code == 'b' {
			tok = syntax.BYTES
		}
		first := xs[0].(*syntax.Literal)
		return &syntax.Literal{Token: tok, TokenPos: first.TokenPos, Raw: first.Raw, Value: buf.String()}
	case 'l':
		var elems []syntax.Expr
		for _, x := range xs {
			elems = append(elems, x.(*syntax.ListExpr).List...)
		}
		return &syntax.ListExpr{Lbrack: xs[0].(*syntax.ListExpr).Lbrack, List: elems, Rbrack: xs[len(xs)-1].(*syntax.ListExpr).Rbrack}
	default: // 't'
		var elems []syntax.Expr
		for _, x := range xs {
			elems = append(elems, x.(*syntax.TupleExpr).List...)
		}
		// With its parentheses' positions: the resolver asks an empty
		// tuple for its span.
		return &syntax.TupleExpr{Lparen: xs[0].(*syntax.TupleExpr).Lparen, List: elems, Rparen: xs[len(xs)-1].(*syntax.TupleExpr).Rparen}
	}
}

// callExpr guards a call's *args and **kwargs, whose contents the
// interpreter copies.
func (rw *rewriter) callExpr(e *syntax.CallExpr) syntax.Expr {
	for i, a := range e.Args {
		switch a := a.(type) {
		case *syntax.BinaryExpr: // name=value
			if a.Op == syntax.EQ {
				a.Y = rw.expr(a.Y)
				continue
			}
		case *syntax.UnaryExpr:
			switch a.Op {
			case syntax.STAR:
				a.X = guardCall(a.OpPos, guardPrefix+"star", rw.expr(a.X))
				continue
			case syntax.STARSTAR:
				a.X = guardCall(a.OpPos, guardPrefix+"starstar", rw.expr(a.X))
				continue
			}
		}
		e.Args[i] = rw.expr(a)
	}
	// x.m(...) for a guarded m becomes __kiroku_attr(x, "m")(...): the
	// attribute looked up, and failing, where it was.
	e.Fn = rw.expr(e.Fn)
	return e
}

// constant reports whether e is a literal, or a sign applied to one: not a
// tuple, and as long as the source says.
func constant(e syntax.Expr) bool {
	if u, ok := e.(*syntax.UnaryExpr); ok && (u.Op == syntax.MINUS || u.Op == syntax.PLUS) {
		e = u.X
	}
	_, ok := e.(*syntax.Literal)
	return ok
}

// guardCall makes a call of the guard name at pos.
func guardCall(pos syntax.Position, name string, args ...syntax.Expr) *syntax.CallExpr {
	return &syntax.CallExpr{Fn: &syntax.Ident{NamePos: pos, Name: name}, Lparen: pos, Args: args, Rparen: pos}
}

func unparen(e syntax.Expr) syntax.Expr {
	for {
		p, ok := e.(*syntax.ParenExpr)
		if !ok {
			return e
		}
		e = p.X
	}
}
