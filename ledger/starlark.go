package ledger

import (
	"context"
	"errors"
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// Starlark contracts.
//
// A contract is one Starlark file that defines invoke(ledger, args). The
// file's top level runs once, when the contract is compiled, and its
// globals are then frozen: invoke may read them but not change them, so no
// state survives between transactions. The interpreter gives a contract no clock, no
// randomness, no I/O and no load(); print() is discarded; dict and set
// iteration follow insertion order and hash() is specified to be the same
// in every process. The only inputs are the argument and what ledger.get
// and ledger.scan return, and those are exactly what the proofs record —
// which is what lets a Validator re-execute the contract and demand
// byte-identical outputs.
//
// The predeclared names are:
//
//	ledger.get(id)                                  → {"age": n, "value": v} or None
//	ledger.put(id, value)                           appends version age+1
//	ledger.scan(id, start_age=0, end_age=-1, ascending=True, limit=0)
//	                                                → [{"age": n, "value": v}, ...]
//	ledger.call(contract_id, args)                  → the nested contract's result
//	fail(msg)                                       aborts: nothing is written,
//	                                                msg goes back to the client
//
// A request's steps are counted across nested calls against
// Limits.MaxSteps. The interpreter's own guard refuses single allocations of
// 1 GiB or more; the ledger sets no tighter memory bound than that.

// fileOptions are the dialect contracts are written in: Starlark with sets,
// while loops and top-level control flow (still bounded by the step limit),
// without recursion.
var fileOptions = &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true}

// starContract is a compiled Starlark contract: its top level has run once
// and its globals are frozen, so every execution (on any goroutine) calls
// the same immutable invoke and none can leave state for the next.
type starContract struct {
	id string
	fn *starlark.Function
}

// compileStarlark parses and compiles source, runs its top level once
// (within 100,000 steps) and checks it defines a function invoke of two
// parameters.
func compileStarlark(id string, source []byte) (*starContract, error) {
	_, prog, err := starlark.SourceProgramOptions(fileOptions, id+".star", source, predeclared.Has)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, err)
	}
	t := newStarThread(Limits{MaxSteps: 100_000}.withDefaults())
	globals, err := prog.Init(t.thread, predeclared)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, err)
	}
	globals.Freeze()
	fn, ok := globals["invoke"].(*starlark.Function)
	if !ok || fn.NumParams() != 2 {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, errNoInvoke)
	}
	return &starContract{id: id, fn: fn}, nil
}

// starThread is the one interpreter thread of an execution; nested
// Starlark contracts run on it, so they share its step budget.
type starThread struct {
	thread   *starlark.Thread
	outOfGas bool
}

func newStarThread(l Limits) *starThread {
	st := &starThread{thread: &starlark.Thread{Name: "contract", Print: func(*starlark.Thread, string) {}}}
	st.thread.SetMaxExecutionSteps(l.MaxSteps)
	st.thread.OnMaxSteps = func(t *starlark.Thread) {
		st.outOfGas = true
		t.Cancel("step limit reached")
	}
	return st
}

// cancelOn cancels the thread when ctx ends, so a contract that runs long
// within its step budget stops at its caller's deadline or cancel, not at
// the end of its budget; the returned function unhooks it.
func (st *starThread) cancelOn(ctx context.Context) func() bool {
	return context.AfterFunc(ctx, func() { st.thread.Cancel("the request's context ended") })
}

// Invoke runs the contract on the execution's Starlark thread.
func (c *starContract) Invoke(ctx *Context, args []byte) ([]byte, error) {
	x := ctx.run
	if x.star == nil {
		x.star = newStarThread(x.limits)
		x.stopCancel = x.star.cancelOn(x.ctx)
	}
	t := x.star
	fail := func(err error) ([]byte, error) {
		if t.outOfGas {
			return nil, fmt.Errorf("%w: %s: more than %d steps", ErrStepLimit, c.id, x.limits.MaxSteps)
		}
		return nil, contractError(c.id, unwrapEval(err))
	}
	decoded, err := decodeJSON(args)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadArgument, err)
	}
	sargs, err := toStarlark(decoded)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadArgument, err)
	}
	prev := t.thread.Local(ctxKey)
	t.thread.SetLocal(ctxKey, ctx)
	res, err := starlark.Call(t.thread, c.fn, starlark.Tuple{ledgerValue{}, sargs}, nil)
	t.thread.SetLocal(ctxKey, prev)
	if err != nil {
		return fail(err)
	}
	v, err := fromStarlark(res, 0)
	if err != nil {
		return nil, fmt.Errorf("result of %s: %w", c.id, err)
	}
	return canonicalOf(v, ErrBadValue)
}

// unwrapEval returns the ledger error a builtin raised inside Starlark, or
// the interpreter's error (message and position) otherwise.
func unwrapEval(err error) error {
	if Kind(err) != "" {
		var ee *starlark.EvalError
		for errors.As(err, &ee) && ee.Unwrap() != nil {
			err = ee.Unwrap()
		}
		return err
	}
	return err
}

const ctxKey = "kiroku.context"

func contextOf(t *starlark.Thread) *Context { return t.Local(ctxKey).(*Context) }

// predeclared are the names every contract sees besides the Starlark
// universe. fail replaces the universe's fail so that its message reaches
// the client as ErrContractFailed.
var predeclared = starlark.StringDict{
	"fail": starlark.NewBuiltin("fail", starFail),
}

func starFail(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var msg string
	if len(kwargs) > 0 || len(args) != 1 {
		return nil, fmt.Errorf("fail: want exactly one argument, the message")
	}
	if s, ok := args[0].(starlark.String); ok {
		msg = string(s)
	} else {
		msg = args[0].String()
	}
	return nil, fmt.Errorf("%w: %s", ErrContractFailed, truncate(msg, 1024))
}

// ledgerValue is the `ledger` argument of invoke. It holds nothing itself:
// its methods find the current Context in the thread, so a contract cannot
// keep a handle that outlives its call.
type ledgerValue struct{}

var (
	_ starlark.HasAttrs = ledgerValue{}

	ledgerMethods = map[string]*starlark.Builtin{
		"get":  starlark.NewBuiltin("get", starGet),
		"put":  starlark.NewBuiltin("put", starPut),
		"scan": starlark.NewBuiltin("scan", starScan),
		"call": starlark.NewBuiltin("call", starCall),
	}
)

func (ledgerValue) String() string        { return "<ledger>" }
func (ledgerValue) Type() string          { return "ledger" }
func (ledgerValue) Freeze()               {}
func (ledgerValue) Truth() starlark.Bool  { return starlark.True }
func (ledgerValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: ledger") }
func (ledgerValue) AttrNames() []string   { return []string{"call", "get", "put", "scan"} }
func (ledgerValue) Attr(name string) (starlark.Value, error) {
	if b, ok := ledgerMethods[name]; ok {
		return b, nil
	}
	return nil, nil
}

func assetDict(v AssetValue) (starlark.Value, error) {
	decoded, err := decodeJSON(v.Value)
	if err != nil {
		return nil, err
	}
	val, err := toStarlark(decoded)
	if err != nil {
		return nil, err
	}
	d := starlark.NewDict(2)
	_ = d.SetKey(starlark.String("age"), starlark.MakeInt64(v.Age))
	_ = d.SetKey(starlark.String("value"), val)
	return d, nil
}

func starGet(t *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var id string
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id", &id); err != nil {
		return nil, err
	}
	v, err := contextOf(t).Get(id)
	if err != nil || v == nil {
		return starlark.None, err
	}
	return assetDict(*v)
}

func starPut(t *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var id string
	var value starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id", &id, "value", &value); err != nil {
		return nil, err
	}
	enc, err := starToJSON(value)
	if err != nil {
		return nil, err
	}
	return starlark.None, contextOf(t).putCanonical(id, enc)
}

func starScan(t *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var id string
	r := ScanRange{End: -1, Ascending: true}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id", &id, "start_age?", &r.Start, "end_age?", &r.End, "ascending?", &r.Ascending, "limit?", &r.Limit); err != nil {
		return nil, err
	}
	vs, err := contextOf(t).Scan(id, r)
	if err != nil {
		return nil, err
	}
	out := make([]starlark.Value, len(vs))
	for i, v := range vs {
		if out[i], err = assetDict(v); err != nil {
			return nil, err
		}
	}
	return starlark.NewList(out), nil
}

func starCall(t *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var id string
	var cargs starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "contract_id", &id, "args?", &cargs); err != nil {
		return nil, err
	}
	enc, err := starToJSON(cargs)
	if err != nil {
		return nil, err
	}
	res, err := contextOf(t).Call(id, enc)
	if err != nil {
		return nil, err
	}
	decoded, err := decodeJSON(res)
	if err != nil {
		return nil, err
	}
	return toStarlark(decoded)
}

func starToJSON(v starlark.Value) ([]byte, error) {
	g, err := fromStarlark(v, 0)
	if err != nil {
		return nil, err
	}
	return canonicalOf(g, ErrBadValue)
}
