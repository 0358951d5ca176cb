package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kiroku-db/kiroku/proof"
)

// Limits bound what one execution may do, and what a ledger's executions
// may do together. Zero fields take the defaults.
type Limits struct {
	// MaxSteps is the Starlark step budget of one request, nested calls
	// included; 0 means 1,000,000. Besides the interpreter's steps it
	// counts the work of hashing and comparing values — large or shared
	// values, keys whose hashes collide — beyond a small allowance per
	// operation, one step per 32 units (see memory.go); an operation that
	// would do more such work than its bound fails with ErrStepLimit
	// before it does.
	MaxSteps uint64
	// MaxMemoryBytes is the memory budget of one request's Starlark, nested
	// calls included, in bytes; 0 means 64 MiB. It counts, cumulatively,
	// what the contracts allocate through every operation whose result can
	// grow by more than a constant per step (repetition, concatenation,
	// formatting, str(), list() and the other conversions, string and
	// collection methods, slices), as estimated before the operation runs,
	// and the values they read, put, pass to ledger.call and return. An
	// operation that would pass the budget fails with ErrMemoryLimit
	// before it allocates. Other allocations are bounded per step, so a
	// request's Starlark holds at most this much plus a small constant per
	// step (see memory.go).
	MaxMemoryBytes int
	// MaxExecutionTime bounds the wall-clock time of one request's
	// Starlark, from its first contract to the end of the outermost call,
	// whatever the client's deadline; 0 means 10 s. A contract still
	// running then stops at its next step (or, in an operation that looks
	// up or stores many keys, at its next key) and the request fails with
	// ErrTimeLimit. It is also the longest a request waits for room under
	// MaxConcurrentExecutions and MaxTotalMemoryBytes before it fails
	// with ErrOverloaded.
	MaxExecutionTime time.Duration
	// MaxConcurrentExecutions bounds, server-wide (per Ledger), the
	// requests whose Starlark runs at once; 0 means 64. More wait, as
	// MaxExecutionTime says. Built-in Go contracts do not count.
	MaxConcurrentExecutions int
	// MaxTotalMemoryBytes bounds, server-wide, the memory budgets of the
	// requests whose Starlark runs at once: each reserves MaxMemoryBytes
	// of it while its Starlark runs; 0 means 1 GiB. It must be at least
	// MaxMemoryBytes.
	MaxTotalMemoryBytes int
	// MaxValueBytes bounds one asset value and a contract's result, in
	// canonical JSON bytes; 0 means 64 KiB.
	MaxValueBytes int
	// MaxArgumentBytes bounds a request's argument as sent; 0 means 64 KiB.
	MaxArgumentBytes int
	// MaxSourceBytes bounds a contract's source; 0 means 256 KiB.
	MaxSourceBytes int
	// MaxCallDepth bounds nested ledger.call; 0 means 8. A contract that
	// calls itself, directly or through others, is refused at once.
	MaxCallDepth int
	// MaxScanLimit caps the versions one scan returns; 0 means 1,000.
	MaxScanLimit int
	// MaxReadBytes bounds the bytes of asset values one request reads
	// through get and scan, nested calls included; 0 means 64 MiB, room
	// for one scan of MaxScanLimit values of MaxValueBytes by default.
	// Without it a contract could keep the results of scan after scan
	// within its step budget, each up to 64 MiB, and exhaust the server's
	// memory. A Starlark contract's reads also count against
	// MaxMemoryBytes, as the values they decode to, which take more bytes
	// than their JSON: under the default budget one such full scan does
	// not fit.
	MaxReadBytes int
	// MaxWrites bounds the assets one transaction writes; 0 means 10,000.
	MaxWrites int
	// MaxReplyBytes bounds an execute's reply (result, receipt and one
	// proof per write, each carrying the transaction's input set),
	// estimated before the transaction commits, and a History page, which
	// holds fewer versions rather than pass it; 0 means 16 MiB. The Go
	// SDK accepts replies of up to client.MaxReplyBytes (64 MiB).
	MaxReplyBytes int
	// MaxValidateVersions bounds the versions one ValidateLedger call
	// checks (each may re-execute a contract); 0 means 10,000. A longer
	// range is validated in several calls.
	MaxValidateVersions int
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if l.MaxSteps == 0 {
		l.MaxSteps = 1_000_000
	}
	def(&l.MaxMemoryBytes, 64<<20)
	if l.MaxExecutionTime <= 0 {
		l.MaxExecutionTime = 10 * time.Second
	}
	def(&l.MaxConcurrentExecutions, 64)
	def(&l.MaxTotalMemoryBytes, 1<<30)
	def(&l.MaxValueBytes, 64<<10)
	def(&l.MaxArgumentBytes, 64<<10)
	def(&l.MaxSourceBytes, 256<<10)
	def(&l.MaxCallDepth, 8)
	def(&l.MaxScanLimit, 1000)
	def(&l.MaxReadBytes, 64<<20)
	def(&l.MaxWrites, 10_000)
	def(&l.MaxReplyBytes, 16<<20)
	def(&l.MaxValidateVersions, 10_000)
	return l
}

// check rejects limits that contradict each other (after withDefaults).
func (l Limits) check() error {
	if l.MaxTotalMemoryBytes < l.MaxMemoryBytes {
		return fmt.Errorf("ledger: Limits.MaxTotalMemoryBytes (%d) is less than MaxMemoryBytes (%d): no contract could run",
			l.MaxTotalMemoryBytes, l.MaxMemoryBytes)
	}
	return nil
}

// Contract is a deterministic one-shot program: given the ledger and a JSON
// argument it reads and appends asset versions and returns a JSON result in
// canonical form. The argument arrives as the client sent it; a contract
// rejects one that is not valid JSON, or not the shape it needs, with
// ErrBadArgument. It must depend on nothing but its argument and what it
// reads through c — no clock, no randomness, no I/O — because a Validator
// re-executes it later and must get byte-identical outputs. Starlark
// contracts have no way to break that rule; built-in Go contracts are
// reviewed code compiled into the binary and must keep it.
type Contract interface {
	Invoke(c *Context, args []byte) (result []byte, err error)
}

// ContractFunc adapts a function returning any JSON to Contract.
type ContractFunc func(c *Context, args []byte) ([]byte, error)

// Invoke calls f and returns its result in canonical form.
func (f ContractFunc) Invoke(c *Context, args []byte) ([]byte, error) {
	res, err := f(c, args)
	if err != nil {
		return nil, err
	}
	return Canonical(res, ErrBadValue)
}

// AssetValue is one version of an asset as a contract sees it.
type AssetValue struct {
	Age   int64
	Value []byte // canonical JSON
}

// ScanRange selects versions of one asset (proof.ScanRange): ages in
// [Start, End] (End < 0 means the latest), in ascending or descending
// order, at most Limit (0 means the ledger's cap).
type ScanRange = proof.ScanRange

// assetStore is the state a contract runs against: a storage transaction
// on the ledger, or the recorded inputs when a version is re-executed.
type assetStore interface {
	get(id string) (*AssetValue, error)
	put(id string, value []byte) error
	scan(id string, r ScanRange) ([]AssetValue, error)
}

// Context is a contract's handle on the ledger during one execution. It is
// not safe for concurrent use, and must not be kept after Invoke returns.
type Context struct {
	store assetStore
	run   *execution
}

// execution is the state shared by a request's top-level contract and every
// contract it calls.
type execution struct {
	ctx    context.Context
	limits Limits
	load   func(id string) (Contract, error)
	stack  []string // ids of the contracts running, outermost first
	// gate bounds the executions running Starlark at once (nil: no bound).
	gate *gate
	star *starThread // created by the first Starlark contract
	// done releases what the first Starlark contract took: its slot of
	// gate, its timer (execution.startStarlark).
	done func()
	// read is the bytes of asset values get and scan returned so far.
	read int
	// storeErr is the first failure of the store itself (storage, a
	// context): not the contract's fault, so it must reach the caller as
	// it is — retryable conflicts retried, nothing recorded as aborted —
	// however the contract (Starlark turns errors into its own) reports it.
	storeErr error
}

// noteStore remembers err if it is the store's (or the contract loader's)
// own failure: every error they make for the contract's sake carries a
// ledger kind.
func (x *execution) noteStore(err error) error {
	if err != nil && x.storeErr == nil && Kind(err) == "" {
		x.storeErr = err
	}
	return err
}

// Get returns the latest version of asset id, or nil if it has none.
func (c *Context) Get(id string) (*AssetValue, error) {
	if err := checkAssetID(id); err != nil {
		return nil, err
	}
	v, err := c.store.get(id)
	if err != nil {
		return nil, c.run.noteStore(err)
	}
	if v != nil {
		if err := c.run.noteRead("get", id, len(v.Value)); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// Put appends a version of id holding value (any JSON; it is stored in
// canonical form). Several puts of one id in a transaction make one version,
// the last value.
func (c *Context) Put(id string, value []byte) error {
	if len(value) > 4*c.run.limits.MaxValueBytes {
		return fmt.Errorf("%w: value of %s is %d bytes, limit %d", ErrTooLarge, id, len(value), c.run.limits.MaxValueBytes)
	}
	canon, err := Canonical(value, ErrBadValue)
	if err != nil {
		return err
	}
	if len(canon) > 0 && &canon[0] == &value[0] {
		canon = bytes.Clone(canon) // the write outlives the caller's buffer
	}
	return c.putCanonical(id, canon)
}

// putCanonical is Put for a value already in canonical form.
func (c *Context) putCanonical(id string, canon []byte) error {
	if err := checkAssetID(id); err != nil {
		return err
	}
	if len(canon) > c.run.limits.MaxValueBytes {
		return fmt.Errorf("%w: value of %s is %d bytes, limit %d", ErrTooLarge, id, len(canon), c.run.limits.MaxValueBytes)
	}
	return c.run.noteStore(c.store.put(id, canon))
}

// Scan returns versions of id within r.
func (c *Context) Scan(id string, r ScanRange) ([]AssetValue, error) {
	if err := checkAssetID(id); err != nil {
		return nil, err
	}
	if r.Start < 0 {
		return nil, fmt.Errorf("%w: scan of %s: start age %d is negative", ErrBadArgument, id, r.Start)
	}
	if r.Limit <= 0 || r.Limit > c.run.limits.MaxScanLimit {
		r.Limit = c.run.limits.MaxScanLimit
	}
	vs, err := c.store.scan(id, r)
	if err != nil {
		return nil, c.run.noteStore(err)
	}
	n := 0
	for i := range vs {
		n += len(vs[i].Value)
	}
	if err := c.run.noteRead("scan", id, n); err != nil {
		return nil, err
	}
	return vs, nil
}

// noteRead counts n bytes read by op of asset id against MaxReadBytes.
func (x *execution) noteRead(op, id string, n int) error {
	x.read += n
	if x.read > x.limits.MaxReadBytes {
		return fmt.Errorf("%w: a %s of %s took the bytes read to %d, limit %d", ErrTooLarge, op, id, x.read, x.limits.MaxReadBytes)
	}
	return nil
}

// Call runs contract id with args in the same transaction and returns its
// result.
func (c *Context) Call(id string, args []byte) ([]byte, error) {
	return c.run.call(c.store, id, args)
}

// call runs one contract (top-level or nested) and returns its canonical
// result.
func (x *execution) call(store assetStore, id string, args []byte) ([]byte, error) {
	if slices.Contains(x.stack, id) {
		return nil, fmt.Errorf("%w: %s calls itself (%s → %s)", ErrCallDepth, id, strings.Join(x.stack, " → "), id)
	}
	if len(x.stack) > x.limits.MaxCallDepth {
		return nil, fmt.Errorf("%w: calling %s at depth %d (limit %d)", ErrCallDepth, id, len(x.stack), x.limits.MaxCallDepth)
	}
	contract, err := x.load(id)
	if err != nil {
		// Loading reads storage too: its failure is not the contract's.
		return nil, x.noteStore(err)
	}
	x.stack = append(x.stack, id)
	out, err := contract.Invoke(&Context{store: store, run: x}, args)
	x.stack = x.stack[:len(x.stack)-1]
	if err != nil {
		return nil, err
	}
	if len(out) > x.limits.MaxValueBytes {
		return nil, fmt.Errorf("%w: result of %s is %d bytes, limit %d", ErrTooLarge, id, len(out), x.limits.MaxValueBytes)
	}
	return out, nil
}

// runContract executes contract id on args against store and returns the
// canonical result. Every failure of the contract's making wraps one of
// the package's sentinels. A failure of the store, and ctx's end (which
// stops a Starlark contract at its next step), are returned as they are,
// with no ledger kind: they say nothing about the request, so no abort is
// recorded. Neither is one for ErrOverloaded, no room under g in time.
// If the contract, or one it calls, is Starlark, the execution holds one
// of g's slots (g nil: no bound) from then until runContract returns.
func runContract(ctx context.Context, limits Limits, g *gate, load func(string) (Contract, error), store assetStore, id string, args []byte) ([]byte, error) {
	x := &execution{ctx: ctx, limits: limits, load: load, gate: g}
	out, err := x.call(store, id, args)
	if x.done != nil {
		x.done()
	}
	if x.storeErr != nil {
		return nil, x.storeErr
	}
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return out, err
}

// Contract and asset ids: 1–128 bytes of printable ASCII other than space.
const maxIDLen = 128

func checkID(what, id string) error {
	if len(id) == 0 || len(id) > maxIDLen {
		return fmt.Errorf("%w: %s %q must be 1–%d bytes", ErrBadRequest, what, truncate(id, 40), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return fmt.Errorf("%w: %s %q has byte %#x; only printable ASCII without spaces is allowed", ErrBadRequest, what, truncate(id, 40), id[i])
		}
	}
	return nil
}

func checkAssetID(id string) error { return checkID("asset id", id) }

// truncate shortens s to at most n bytes (and an ellipsis) for a message.
func truncate(s string, n int) string {
	if len(s) > n {
		// On a character's first byte, so the text stays valid UTF-8.
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		return s[:n] + "…"
	}
	return s
}

// storableText is s as a TEXT column holds it on every backend: valid
// UTF-8 (an invalid byte becomes U+FFFD), no NUL (PostgreSQL refuses it;
// it becomes U+FFFD too), at most n bytes (see truncate). A contract's
// failure message, which a contract writes as it likes, is recorded so.
func storableText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return truncate(s, n)
}

// BuiltinPrefix starts the id of every contract compiled into the binary;
// clients cannot register ids with it.
const BuiltinPrefix = "builtin."

// Builtins are the Go contracts compiled into kiroku. The benchmarks use
// them; they follow the same rules as Starlark contracts.
var Builtins = map[string]Contract{
	// builtin.ycsb_c reads two assets: {"ids": [a, b]} → {"a": value, ...}.
	BuiltinPrefix + "ycsb_c": ContractFunc(ycsbC),
	// builtin.ycsb_f reads one asset and writes it back modified:
	// {"id": a, "payload": p} → {"age": new age}.
	BuiltinPrefix + "ycsb_f": ContractFunc(ycsbF),
	// builtin.bulk_load creates assets: {"prefix": p, "first": i,
	// "count": n, "payload": s} puts {"payload": s} under p+i … p+(i+n−1),
	// each number zero-padded to "width" digits if given (so that ids sort
	// as their numbers do).
	BuiltinPrefix + "bulk_load": ContractFunc(bulkLoad),
}

// builtinArgs decodes a built-in's argument into dst under the rules a
// Starlark contract's argument meets (one JSON text, no duplicate keys,
// safe integers, bounded nesting), and accepts only an object whose keys
// are among fields, spelled exactly: encoding/json alone would take the
// last of two equal keys and match keys case-insensitively, so one signed
// argument could be read two ways. simple, if not nil, decodes the
// members of an argument in the subset simpleMembers reads, and reports
// whether each was of its field's type; if it cannot, encoding/json
// decodes the argument (and names what is wrong).
func builtinArgs(args []byte, dst any, simple func([]member) bool, fields ...string) error {
	canon, err := Canonical(args, ErrBadArgument)
	if err != nil {
		return err
	}
	if len(canon) == 0 || canon[0] != '{' {
		return fmt.Errorf("%w: not a JSON object", ErrBadArgument)
	}
	if k, ok := unknownKey(canon, fields); !ok {
		return fmt.Errorf("%w: unknown field %s", ErrBadArgument, truncate(k, 40))
	}
	if simple != nil {
		var buf [4]member
		if ms, ok := simpleMembers(canon, buf[:0]); ok && simple(ms) {
			return nil
		}
	}
	if err := json.Unmarshal(canon, dst); err != nil {
		return fmt.Errorf("%w: %v", ErrBadArgument, err)
	}
	return nil
}

// unknownKey returns the first member name of the canonical JSON object c
// that is not one of fields, quoted as it is written, or ok. Names are
// compared as written: one with an escape is never a field's plain name.
func unknownKey(c []byte, fields []string) (key string, ok bool) {
	depth, expectKey := 0, false
	for i := 0; i < len(c); i++ {
		switch c[i] {
		case '"':
			j := i + 1
			for c[j] != '"' {
				if c[j] == '\\' {
					j++
				}
				j++
			}
			if depth == 1 && expectKey {
				if name := c[i+1 : j]; !slices.ContainsFunc(fields, func(f string) bool { return f == string(name) }) {
					return string(c[i : j+1]), false
				}
				expectKey = false
			}
			i = j
		case '{', '[':
			depth++
			expectKey = depth == 1
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		}
	}
	return "", true
}

func ycsbC(c *Context, args []byte) ([]byte, error) {
	var a struct {
		IDs []string `json:"ids"`
	}
	const want = `want {"ids": [...]}`
	simple := func(ms []member) (ok bool) {
		for _, m := range ms { // "ids" alone: builtinArgs checked the names
			a.IDs, ok = simpleStrings(m.raw)
		}
		return ok || len(ms) == 0
	}
	if err := builtinArgs(args, &a, simple, "ids"); err != nil {
		return nil, fmt.Errorf("%w; %s", err, want)
	}
	if len(a.IDs) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrBadArgument, want)
	}
	out := make(map[string]json.RawMessage, len(a.IDs))
	for _, id := range a.IDs {
		v, err := c.Get(id)
		if err != nil {
			return nil, err
		}
		if v == nil {
			out[id] = json.RawMessage("null")
		} else {
			out[id] = v.Value
		}
	}
	return json.Marshal(out)
}

func ycsbF(c *Context, args []byte) ([]byte, error) {
	var a struct {
		ID      string `json:"id"`
		Payload string `json:"payload"`
	}
	const want = `want {"id": ..., "payload": ...}`
	simple := func(ms []member) bool {
		for _, m := range ms {
			v, ok := simpleString(m.raw)
			if !ok {
				return false
			}
			if m.name == "id" {
				a.ID = v
			} else {
				a.Payload = v
			}
		}
		return true
	}
	if err := builtinArgs(args, &a, simple, "id", "payload"); err != nil {
		return nil, fmt.Errorf("%w; %s", err, want)
	}
	if a.ID == "" {
		return nil, fmt.Errorf("%w: %s", ErrBadArgument, want)
	}
	v, err := c.Get(a.ID)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, fmt.Errorf("%w: asset %s does not exist", ErrContractFailed, a.ID)
	}
	var cur ycsbValue
	if !cur.simple(v.Value) {
		cur.Payload, cur.Updates = "", 0
		if err := json.Unmarshal(v.Value, &cur); err != nil {
			return nil, fmt.Errorf("%w: asset %s: %v", ErrContractFailed, a.ID, err)
		}
	}
	cur.Payload = a.Payload
	cur.Updates++
	if next, ok := cur.appendSimple(make([]byte, 0, 32+len(cur.Payload))); ok {
		// Canonical already, as Put would make it.
		if err := c.putCanonical(a.ID, next); err != nil {
			return nil, err
		}
	} else {
		next, err := json.Marshal(cur)
		if err != nil {
			return nil, err
		}
		if err := c.Put(a.ID, next); err != nil {
			return nil, err
		}
	}
	return append(strconv.AppendInt(append(make([]byte, 0, 32), `{"age":`...), v.Age+1, 10), '}'), nil
}

// ycsbValue is the value of a YCSB asset.
type ycsbValue struct {
	Payload string `json:"payload"`
	Updates int64  `json:"updates"`
}

// simple decodes v from canon if it is in the subset simpleMembers reads
// and its members have the types of v's fields; absent members leave
// their fields as they are, as encoding/json does.
func (v *ycsbValue) simple(canon []byte) bool {
	var buf [2]member
	ms, ok := simpleMembers(canon, buf[:0])
	for _, m := range ms {
		switch {
		case m.name == "payload":
			v.Payload, ok = simpleString(m.raw)
		case m.name == "updates":
			v.Updates, ok = simpleInt(m.raw)
		case strings.EqualFold(m.name, "payload") || strings.EqualFold(m.name, "updates"):
			ok = false // encoding/json would take it for the field
		}
		if !ok {
			return false
		}
	}
	return ok
}

// appendSimple appends v's canonical JSON if its payload is in the subset
// simpleMembers reads (its updates count is a safe integer).
func (v *ycsbValue) appendSimple(b []byte) ([]byte, bool) {
	b = append(b, `{"payload":`...)
	b, ok := appendSimpleString(b, v.Payload)
	if !ok || v.Updates < 0 || v.Updates > maxSafeInt {
		return nil, false
	}
	b = append(b, `,"updates":`...)
	return append(strconv.AppendInt(b, v.Updates, 10), '}'), true
}

func bulkLoad(c *Context, args []byte) ([]byte, error) {
	var a struct {
		Prefix  string `json:"prefix"`
		First   int64  `json:"first"`
		Count   int64  `json:"count"`
		Payload string `json:"payload"`
		Width   int    `json:"width"`
	}
	const want = `want {"prefix", "first" ≥ 0, "count" > 0, "payload", optional "width" 0–20}`
	if err := builtinArgs(args, &a, nil, "prefix", "first", "count", "payload", "width"); err != nil {
		return nil, fmt.Errorf("%w; %s", err, want)
	}
	if a.Count <= 0 || a.First < 0 || a.Width < 0 || a.Width > 20 {
		return nil, fmt.Errorf("%w: %s", ErrBadArgument, want)
	}
	if a.Count > int64(c.run.limits.MaxWrites) {
		return nil, fmt.Errorf("%w: bulk load of %d assets, limit %d per transaction", ErrTooLarge, a.Count, c.run.limits.MaxWrites)
	}
	value, err := json.Marshal(map[string]any{"payload": a.Payload, "updates": 0})
	if err != nil {
		return nil, err
	}
	for i := a.First; i < a.First+a.Count; i++ {
		if err := c.Put(fmt.Sprintf("%s%0*d", a.Prefix, a.Width, i), value); err != nil {
			return nil, err
		}
	}
	return []byte(fmt.Sprintf(`{"loaded":%d}`, a.Count)), nil
}

// contractError turns a failure inside a contract into the error the client
// gets: one of the package's sentinels, with the contract's message.
func contractError(id string, err error) error {
	if err == nil || Kind(err) != "" {
		return err
	}
	msg := err.Error()
	if i := strings.Index(msg, "\n"); i >= 0 {
		msg = msg[:i]
	}
	// The message is recorded as the abort's reason: keep it short.
	return fmt.Errorf("%w: %s: %s", ErrContractFailed, id, truncate(msg, maxFailText))
}

var errNoInvoke = errors.New("defines no function invoke(ledger, args)")
