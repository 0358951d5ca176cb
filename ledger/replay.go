package ledger

import (
	"context"
	"errors"
	"fmt"
)

// VersionSource serves the versions a re-execution reads: the ledger's own
// storage when it validates itself, a Validator's recomputed states when a
// second domain does.
type VersionSource interface {
	// Output returns the value of version age of asset id, or an error
	// wrapping ErrNotFound.
	Output(ctx context.Context, id string, age int64) ([]byte, error)
}

// Replayed is what a re-execution produced.
type Replayed struct {
	Result []byte            // the contract's result, canonical JSON
	Writes map[string][]byte // asset id → the value written, canonical JSON
}

// CompileContract compiles Starlark contract source as RegisterContract
// does, for a re-execution outside the ledger.
func CompileContract(id string, source []byte) (Contract, error) {
	return compileStarlark(context.Background(), id, source, Limits{}.withDefaults())
}

// Replay re-executes one transaction: contract on argument, with every get
// and scan served from src at the ages input (the transaction's read set)
// names, and its puts collected. writes are the ages the transaction
// committed; a get of an asset it wrote earlier returns that write at that
// age, as it did when the ledger ran it.
//
// A transaction that re-executes differently — it reads an asset outside
// input, writes one outside writes, or fails — is a divergence, returned as
// a non-empty description. err is kept for failures that are not the
// transaction's: src failing, a context cancelled, and the time limit
// (ErrTimeLimit), which depends on the machine and its load, not on the
// transaction.
func Replay(ctx context.Context, lim Limits, load func(id string) (Contract, error), contract string, argument []byte,
	input, writes map[string]int64, src VersionSource) (*Replayed, string, error) {
	return replay(ctx, lim, nil, load, contract, argument, input, writes, src)
}

// replay is Replay with the executions bounded by g (nil: no bound).
func replay(ctx context.Context, lim Limits, g *gate, load func(id string) (Contract, error), contract string, argument []byte,
	input, writes map[string]int64, src VersionSource) (*Replayed, string, error) {
	s := &replayStore{ctx: ctx, src: src, input: input, written: writes, writes: map[string][]byte{}}
	res, rerr := runContract(ctx, lim.withDefaults(), g, load, s, contract, argument)
	switch {
	case s.missing != "":
		return nil, s.missing, nil
	case rerr != nil && (Kind(rerr) == "" || errors.Is(rerr, ErrTimeLimit) || errors.Is(rerr, ErrOverloaded)):
		return nil, "", rerr
	case rerr != nil:
		return nil, "re-execution fails: " + rerr.Error(), nil
	case s.stray != "":
		return nil, fmt.Sprintf("re-execution reads asset %s, which is not in the transaction's input", s.stray), nil
	}
	for id := range s.writes {
		if _, ok := writes[id]; !ok {
			return nil, fmt.Sprintf("re-execution writes asset %s, which the transaction did not", id), nil
		}
	}
	for id := range writes {
		if _, ok := s.writes[id]; !ok {
			return nil, fmt.Sprintf("re-execution does not write asset %s, which the transaction did", id), nil
		}
	}
	return &Replayed{Result: res, Writes: s.writes}, "", nil
}

// replayStore serves a re-execution from the versions a read set names.
// Reading anything else is a divergence.
type replayStore struct {
	ctx     context.Context
	src     VersionSource
	input   map[string]int64
	written map[string]int64 // the ages the transaction wrote
	writes  map[string][]byte
	stray   string // the first asset read outside the input
	missing string // an input version src does not have
}

func (s *replayStore) age(id string) (int64, bool) {
	a, ok := s.input[id]
	if !ok && s.stray == "" {
		s.stray = id
	}
	return a, ok
}

func (s *replayStore) output(id string, age int64) ([]byte, error) {
	out, err := s.src.Output(s.ctx, id, age)
	if errors.Is(err, ErrNotFound) && s.missing == "" {
		s.missing = fmt.Sprintf("input version %s/%d is missing", id, age)
	}
	return out, err
}

func (s *replayStore) get(id string) (*AssetValue, error) {
	if w, written := s.writes[id]; written {
		// The transaction's own write: its age is the one it committed.
		a, ok := s.written[id]
		if !ok && s.stray == "" {
			s.stray = id
		}
		return &AssetValue{Age: a, Value: w}, nil
	}
	a, ok := s.age(id)
	if !ok || a < 0 {
		return nil, nil
	}
	out, err := s.output(id, a)
	if err != nil {
		return nil, err
	}
	return &AssetValue{Age: a, Value: out}, nil
}

func (s *replayStore) put(id string, value []byte) error {
	s.writes[id] = value
	return nil
}

// scan serves ages [r.Start, min(r.End, input age)] one version at a time,
// in r's order, at most r.Limit (which Context.Scan has bounded).
func (s *replayStore) scan(id string, r ScanRange) ([]AssetValue, error) {
	a, ok := s.age(id)
	if !ok || a < 0 {
		return nil, nil
	}
	end := r.End
	if end < 0 || end > a {
		end = a
	}
	var out []AssetValue
	for i := int64(0); r.Start+i <= end && len(out) < r.Limit; i++ {
		age := r.Start + i
		if !r.Ascending {
			age = end - i
		}
		v, err := s.output(id, age)
		if err != nil {
			return nil, err
		}
		out = append(out, AssetValue{Age: age, Value: v})
	}
	return out, nil
}
