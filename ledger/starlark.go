package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

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
// stops at Limits.MaxExecutionTime. Hashing and comparing values is
// bounded and charged as steps (memory.go). The top level of a contract
// runs within 100,000 steps and the same memory and time limits, but at
// most the defaults (topLevelLimits).

// fileOptions are the dialect contracts are written in: Starlark with sets,
// while loops and top-level control flow (still bounded by the step limit),
// without recursion.
var fileOptions = &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true}

// starContract is a compiled Starlark contract. Its top level runs once —
// when it compiles (compileStarlark), or, if it was only prepared
// (prepareStarlark), at its first Invoke — and its globals are then
// frozen, so every execution (on any goroutine) calls the same immutable
// invoke and none can leave state for the next.
type starContract struct {
	id   string
	prog *starlark.Program
	// fn is invoke, once the top level has run.
	fn atomic.Pointer[starlark.Function]
	// initLock holds a value while an execution runs the top level.
	// failed, which it guards, is how the top level failed if it fails
	// whatever runs it (not for a time limit or an ended context, which
	// say nothing about the contract): it is not run again.
	initLock chan struct{}
	failed   error
}

// topLevelSteps bounds the steps of a contract's top level.
const topLevelSteps = 100_000

// topLevelLimits are the limits a contract's top level runs within: lim's
// (or the defaults where lim is not set), but at most topLevelSteps steps
// and at most the default memory and time limits, whatever the ledger's
// configuration. CompileContract, with which a Validator compiles the
// contracts it re-executes, assumes the defaults: with the top level held
// to them, or to less, a contract the ledger accepted compiles there too,
// to the same globals — a top level is deterministic, and its charges and
// refusals are monotonic in the limits (a larger budget never refuses what
// a smaller one took). Only a time limit can differ between machines; a
// top level that runs out of time fails with ErrTimeLimit as well as
// ErrBadContract, which Replay reports as no divergence.
func topLevelLimits(lim Limits) Limits {
	lim, d := lim.withDefaults(), Limits{}.withDefaults()
	lim.MaxSteps = topLevelSteps
	lim.MaxMemoryBytes = min(lim.MaxMemoryBytes, d.MaxMemoryBytes)
	lim.MaxExecutionTime = min(lim.MaxExecutionTime, d.MaxExecutionTime)
	return lim
}

// prepareStarlark parses source, rewrites it behind the guards and
// compiles it, running nothing: its top level runs at its first Invoke,
// within the gate and the limits of the execution that invokes it
// (starContract.function).
func prepareStarlark(id string, source []byte) (*starContract, error) {
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
	return &starContract{id: id, prog: prog, initLock: make(chan struct{}, 1)}, nil
}

// compileStarlark prepares source (prepareStarlark) and runs its top
// level once, within topLevelLimits(lim) or until ctx ends, checking that
// it defines a function invoke of two parameters.
func compileStarlark(ctx context.Context, id string, source []byte, lim Limits) (*starContract, error) {
	c, err := prepareStarlark(id, source)
	if err != nil {
		return nil, err
	}
	fn, err := runTopLevel(ctx, id, c.prog, lim)
	if err != nil {
		return nil, err
	}
	c.fn.Store(fn)
	return c, nil
}

// runTopLevel runs prog's top level within topLevelLimits(lim) or until
// ctx ends (failing with ctx's error), freezes its globals and returns
// its invoke.
func runTopLevel(ctx context.Context, id string, prog *starlark.Program, lim Limits) (*starlark.Function, error) {
	lim = topLevelLimits(lim)
	t, stop := newStarThread(ctx, lim)
	var globals starlark.StringDict
	err := safely(func() (err error) {
		globals, err = prog.Init(t.thread, predeclared)
		return err
	})
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if lerr := t.limitError(id+" (top level)", lim); lerr != nil {
			if errors.Is(lerr, ErrTimeLimit) {
				return nil, fmt.Errorf("%w: %s: %w", ErrBadContract, id, lerr)
			}
			err = lerr
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, err)
	}
	// Twice the work bound: what the budget can hold without sharing, and
	// the tuples a top level's steps can make besides.
	if max := 2 * t.maxWork(); freezeUnits(globals, max) > max {
		return nil, fmt.Errorf("%w: %s: %w: %s (top level): freezing its globals would visit more than %d values (shared parts counted each time they are reached; a function that captures itself, without end)",
			ErrBadContract, id, ErrStepLimit, id, max)
	}
	globals.Freeze()
	fn, ok := globals["invoke"].(*starlark.Function)
	if !ok || fn.NumParams() != 2 {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadContract, id, errNoInvoke)
	}
	return fn, nil
}

// function returns c's invoke, running its top level first if it has not
// run, for execution x, which is running Starlark (x.star): within the
// same bounds as a registration's compile — a slot of the gate, the top
// level's own budgets (topLevelLimits) — and within x's time. The
// execution's first Starlark contract (first) runs it in the slot the
// execution has just taken, before the execution has allocated anything.
// A nested one takes a second slot, waiting for it at most as long as x
// may still run: an execution that waits holds its slot no longer than
// one that runs (which is what lets executions that hold every slot and
// wait for another fail, rather than wait for good), and fails with
// ErrOverloaded, nothing recorded, if none comes. The slot is taken
// before the lock that lets one execution at a time run the top level,
// and whoever holds that lock waits for nothing else, so waits make no
// cycle.
func (c *starContract) function(x *execution, first bool) (*starlark.Function, error) {
	if fn := c.fn.Load(); fn != nil {
		return fn, nil
	}
	limit := x.star.limit
	if x.gate != nil && !first {
		deadline, _ := limit.Deadline()
		leave, err := x.gate.enter(limit, time.Until(deadline))
		if err != nil {
			if errors.Is(err, ErrOverloaded) || context.Cause(limit) == errTimeUp {
				err = fmt.Errorf("%w: no room to run the top level of %s (its first call in this process)", ErrOverloaded, c.id)
				if x.storeErr == nil {
					x.storeErr = err // not the request's failure: nothing is recorded
				}
			}
			return nil, err
		}
		defer leave()
	}
	select {
	case c.initLock <- struct{}{}:
	case <-limit.Done():
		return nil, limit.Err()
	}
	defer func() { <-c.initLock }()
	if fn := c.fn.Load(); fn != nil {
		return fn, nil
	}
	if c.failed != nil {
		return nil, c.failed
	}
	fn, err := runTopLevel(limit, c.id, c.prog, x.limits)
	if err != nil {
		if limit.Err() == nil && !errors.Is(err, ErrTimeLimit) {
			c.failed = err
		}
		return nil, err
	}
	c.fn.Store(fn)
	return fn, nil
}

// starThread is the one interpreter thread of an execution; nested
// Starlark contracts run on it, so they share its step, memory and time
// budgets.
type starThread struct {
	thread   *starlark.Thread
	outOfGas bool
	// owed are steps the guards are to give back still (refund).
	owed uint64
	// maxSteps is the thread's step limit; charged are the steps the
	// hashing and comparison guards charged (memory.go), part of
	// thread.Steps.
	maxSteps, charged uint64
	// workRefused describes the first operation refused for what its
	// hashing and comparing would take: the execution fails with
	// ErrStepLimit whatever became of the error on its way out.
	workRefused string
	mem         memAccount
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
		mem: memAccount{limit: int64(l.MaxMemoryBytes)}, maxSteps: l.MaxSteps}
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

// errCancelled starts the error of an operation that stopped because its
// thread was cancelled, in the interpreter's words.
var errCancelled = errors.New("starlark computation cancelled")

// interrupted returns the error the interpreter's next step would fail
// with if the thread has been cancelled — its time limit reached, its
// request's context ended — and nil otherwise. The interpreter checks
// only between steps; a guard that can run long within one (memory.go,
// "Collisions") checks as it goes. (The step limit cancels the thread
// only at a step, or where chargeSteps reports it.)
func (st *starThread) interrupted() error {
	select {
	case <-st.limit.Done():
	default:
		return nil
	}
	if context.Cause(st.limit) == errTimeUp {
		return fmt.Errorf("%w: time limit reached", errCancelled)
	}
	return fmt.Errorf("%w: the request's context ended", errCancelled)
}

// limitError is the error of an execution on st that one of its limits
// ended, or nil: the step limit, the time limit (not the context of the
// request), or a memory charge refused.
func (st *starThread) limitError(id string, l Limits) error {
	switch {
	case st.workRefused != "":
		return fmt.Errorf("%w: %s: %s", ErrStepLimit, id, st.workRefused)
	case st.outOfGas:
		return fmt.Errorf("%w: %s: more than %d steps", ErrStepLimit, id, l.MaxSteps)
	case context.Cause(st.limit) == errTimeUp:
		return fmt.Errorf("%w: %s: still running after %v", ErrTimeLimit, id, l.MaxExecutionTime)
	case st.mem.refused != "":
		return fmt.Errorf("%w: %s: %s", ErrMemoryLimit, id, st.mem.refused)
	}
	return nil
}

// chargeSteps adds n steps to the thread's count (the steps of hashing
// and comparing, memory.go), failing with ErrStepLimit, as the
// interpreter's next step would, if that reaches the limit.
func (st *starThread) chargeSteps(n uint64) error {
	if n == 0 {
		return nil
	}
	th := st.thread
	th.Steps += n
	st.charged += n
	if th.Steps >= st.maxSteps {
		st.outOfGas = true
		th.Cancel("step limit reached")
		return fmt.Errorf("%w: more than %d steps", ErrStepLimit, st.maxSteps)
	}
	return nil
}

// refuseWork refuses an operation for what its hashing and comparing
// would take: detail says which.
func (st *starThread) refuseWork(detail string) error {
	if st.workRefused == "" {
		st.workRefused = detail
	}
	return fmt.Errorf("%w: %s", ErrStepLimit, detail)
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
	first := x.star == nil
	if first {
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
	fn, err := c.function(x, first)
	if err != nil {
		if Kind(err) != "" {
			return nil, err
		}
		return fail(err) // the execution's limit, or its context, ended
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
		res, err = starlark.Call(t.thread, fn, starlark.Tuple{ledgerValue{}, sargs}, nil)
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
		// A value can take milliseconds to decode (an object of a
		// thousand keys of one hash): stop between them.
		if err := st.interrupted(); err != nil {
			return nil, err
		}
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
