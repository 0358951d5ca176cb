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
// randomness, no I/O and no load(); print() does nothing; dict and set
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
// Names starting with __kiroku_ are reserved (guard.go).
//
// A request's steps are counted across nested calls against
// Limits.MaxSteps, the memory its contracts allocate against
// Limits.MaxMemoryBytes (memory.go: every contract is rewritten when it
// compiles so that each operation able to allocate more than a constant
// per step is estimated and charged first, guard.go), and its Starlark
// stops at Limits.MaxExecutionTime. The top level of a contract runs
// under the same memory and time limits, within 100,000 steps.

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

// compileStarlark parses source, rewrites it behind the memory guards,
// compiles it, runs its top level once (within 100,000 steps and lim's
// memory and time limits, or until ctx ends) and checks it defines a
// function invoke of two parameters.
func compileStarlark(ctx context.Context, id string, source []byte, lim Limits) (*starContract, error) {
	f, err := fileOptions.Parse(id+".star", source, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, err)
	}
	var prog *starlark.Program
	err = safely(func() (err error) {
		if err := rewriteContract(f); err != nil {
			return err
		}
		prog, err = starlark.FileProgram(f, predeclared.Has)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, err)
	}
	lim.MaxSteps = 100_000
	t, stop := newStarThread(ctx, lim)
	var globals starlark.StringDict
	err = safely(func() (err error) {
		globals, err = prog.Init(t.thread, predeclared)
		return err
	})
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if lerr := t.limitError(id+" (top level)", lim); lerr != nil {
			err = lerr
		}
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
// Starlark contracts run on it, so they share its step, memory and time
// budgets.
type starThread struct {
	thread   *starlark.Thread
	outOfGas bool
	// owed are steps the guards are to give back still (refund).
	owed uint64
	mem  memAccount
	// limit ends at the time limit, with cause errTimeUp, or with the
	// request's context; the thread is cancelled when it does.
	limit context.Context
}

// errTimeUp is the cause of a starThread's limit that ended at the time
// limit.
var errTimeUp = errors.New("time limit reached")

// newStarThread makes a thread within l's steps, memory and time, which
// also stops when ctx ends. stop releases the timer; call it when the
// thread is done.
func newStarThread(ctx context.Context, l Limits) (t *starThread, stop func()) {
	st := &starThread{thread: &starlark.Thread{Name: "contract", Print: func(*starlark.Thread, string) {}},
		mem: memAccount{limit: int64(l.MaxMemoryBytes)}}
	st.thread.SetLocal(starKey, st)
	st.thread.SetMaxExecutionSteps(l.MaxSteps)
	st.thread.OnMaxSteps = func(t *starlark.Thread) {
		st.outOfGas = true
		t.Cancel("step limit reached")
	}
	limit, cancel := context.WithTimeoutCause(ctx, l.MaxExecutionTime, errTimeUp)
	st.limit = limit
	unhook := context.AfterFunc(limit, func() {
		if context.Cause(limit) == errTimeUp {
			st.thread.Cancel("time limit reached")
		} else {
			st.thread.Cancel("the request's context ended")
		}
	})
	return st, func() { unhook(); cancel() }
}

// limitError is the error of an execution on st that one of its limits
// ended, or nil: the step limit, the time limit (not the context of the
// request), or a memory charge refused.
func (st *starThread) limitError(id string, l Limits) error {
	switch {
	case st.outOfGas:
		return fmt.Errorf("%w: %s: more than %d steps", ErrStepLimit, id, l.MaxSteps)
	case context.Cause(st.limit) == errTimeUp:
		return fmt.Errorf("%w: %s: still running after %v", ErrTimeLimit, id, l.MaxExecutionTime)
	case st.mem.refused != "":
		return fmt.Errorf("%w: %s: %s", ErrMemoryLimit, id, st.mem.refused)
	}
	return nil
}

// startStarlark readies an execution's first Starlark contract: it waits
// for room under the ledger's gate (if any), then makes the thread every
// contract of the execution runs on. runContract releases both.
func (x *execution) startStarlark() error {
	leave := func() {}
	if x.gate != nil {
		var err error
		if leave, err = x.gate.enter(x.ctx, x.limits.MaxExecutionTime); err != nil {
			return err
		}
	}
	st, stop := newStarThread(x.ctx, x.limits)
	x.star = st
	x.done = func() {
		stop()
		leave()
	}
	return nil
}

// Invoke runs the contract on the execution's Starlark thread.
func (c *starContract) Invoke(ctx *Context, args []byte) ([]byte, error) {
	x := ctx.run
	if x.star == nil {
		if err := x.startStarlark(); err != nil {
			return nil, err
		}
	}
	t := x.star
	fail := func(err error) ([]byte, error) {
		if lerr := t.limitError(c.id, x.limits); lerr != nil {
			return nil, lerr
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
	if err := t.mem.charge(valueBytes(sargs), "the argument"); err != nil {
		return fail(err)
	}
	prev := t.thread.Local(ctxKey)
	t.thread.SetLocal(ctxKey, ctx)
	var res starlark.Value
	err = safely(func() (err error) {
		res, err = starlark.Call(t.thread, c.fn, starlark.Tuple{ledgerValue{}, sargs}, nil)
		return err
	})
	t.thread.SetLocal(ctxKey, prev)
	if err != nil {
		return fail(err)
	}
	if limit := int64(x.limits.MaxValueBytes); jsonFloor(res, limit) > limit {
		return nil, fmt.Errorf("%w: result of %s is more than %d bytes", ErrTooLarge, c.id, limit)
	}
	v, err := fromStarlark(res, 0)
	if err != nil {
		return nil, fmt.Errorf("result of %s: %w", c.id, err)
	}
	return canonicalOf(v, ErrBadValue)
}

// safely runs f, which runs Starlark, and turns a panic into an error. The
// interpreter has built-ins that panic on some arguments (set methods
// called without one, before the guards refused that), and a contract
// must not be able to take the server down. The thread is not used again.
func safely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the interpreter failed: %v", r)
		}
	}()
	return f()
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

// maxFailText bounds the message of fail().
const maxFailText = 1024

func starFail(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var msg string
	if len(kwargs) > 0 || len(args) != 1 {
		return nil, fmt.Errorf("fail: want exactly one argument, the message")
	}
	if s, ok := args[0].(starlark.String); ok {
		msg = string(s)
	} else if n, err := reprLen(args[0], maxFailText); err == nil && n <= maxFailText {
		msg = args[0].String()
	} else {
		msg = fmt.Sprintf("<a %s longer than %d bytes as text>", args[0].Type(), maxFailText)
	}
	return nil, fmt.Errorf("%w: %s", ErrContractFailed, truncate(msg, maxFailText))
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

// assetDict decodes a version for a contract, charging what the value
// takes to t's budget.
func assetDict(t *starThread, v AssetValue) (starlark.Value, error) {
	decoded, err := decodeJSON(v.Value)
	if err != nil {
		return nil, err
	}
	val, err := toStarlark(decoded)
	if err != nil {
		return nil, err
	}
	if err := t.mem.charge(tableBytes+2*entryBytes+valueBytes(val), "a value read"); err != nil {
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
	return assetDict(starOf(t), *v)
}

func starPut(t *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var id string
	var value starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id", &id, "value", &value); err != nil {
		return nil, err
	}
	c := contextOf(t)
	if limit := int64(c.run.limits.MaxValueBytes); jsonFloor(value, limit) > limit {
		return nil, fmt.Errorf("%w: value of %s is more than %d bytes", ErrTooLarge, id, limit)
	}
	enc, err := starToJSON(value)
	if err != nil {
		return nil, err
	}
	if err := starOf(t).mem.charge(jsonBytes(len(enc)), "a value put"); err != nil {
		return nil, err
	}
	return starlark.None, c.putCanonical(id, enc)
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
	st := starOf(t)
	if err := st.mem.charge(listBytes+slotBytes*int64(len(vs)), "a scan"); err != nil {
		return nil, err
	}
	out := make([]starlark.Value, len(vs))
	for i, v := range vs {
		if out[i], err = assetDict(st, v); err != nil {
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
	st := starOf(t)
	// With shared references a small value can stand for an enormous
	// text: measure it (cheaply, stopping past the room left) first.
	if room := st.mem.room() / jsonBytes(1); room >= 0 {
		if n := jsonFloor(cargs, room); n > room {
			return nil, st.mem.refuse("the argument of a call", jsonBytes(n))
		}
	}
	enc, err := starToJSON(cargs)
	if err != nil {
		return nil, err
	}
	if err := st.mem.charge(jsonBytes(len(enc)), "the argument of a call"); err != nil {
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
	v, err := toStarlark(decoded)
	if err != nil {
		return nil, err
	}
	if err := st.mem.charge(valueBytes(v), "the result of a call"); err != nil {
		return nil, err
	}
	return v, nil
}

// jsonBytes is the charge for converting a value whose canonical JSON is
// n bytes: the JSON-able Go value, the text and its canonical form.
func jsonBytes[N int | int64](n N) int64 { return 3 * int64(n) }

func starToJSON(v starlark.Value) ([]byte, error) {
	g, err := fromStarlark(v, 0)
	if err != nil {
		return nil, err
	}
	return canonicalOf(g, ErrBadValue)
}
