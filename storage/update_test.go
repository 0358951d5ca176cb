package storage

import (
	"context"
	"errors"
	"testing"
	"time"
)

// scriptedTxn is a transaction whose Commit returns the next scripted
// error; it exists to test Update's retry loop, not any backend.
type scriptedTxn struct {
	Txn
	commitErr error
	aborted   *int
}

func (s *scriptedTxn) Commit(context.Context) error { return s.commitErr }
func (s *scriptedTxn) Abort(context.Context) error  { *s.aborted++; return nil }

type scriptedDB struct {
	commits []error // one per attempt; the last repeats
	begun   int
	aborted int
}

func (d *scriptedDB) Begin(context.Context) (Txn, error) {
	i := min(d.begun, len(d.commits)-1)
	d.begun++
	return &scriptedTxn{commitErr: d.commits[i], aborted: &d.aborted}, nil
}

// fast retries five times without sleeping.
var fast = RetryPolicy{MaxAttempts: 5, Jitter: func(time.Duration) time.Duration { return 0 }}

func TestUpdateRetries(t *testing.T) {
	ctx := context.Background()
	conflict := &Error{Kind: ErrConflict}
	unavailable := &Error{Kind: ErrUnavailable}
	unknown := &Error{Kind: ErrCommitUnknown}
	cases := []struct {
		name    string
		commits []error
		fnErr   error
		want    error
		begun   int
		aborted int
	}{
		{"first try", []error{nil}, nil, nil, 1, 0},
		{"conflicts then success", []error{conflict, unavailable, nil}, nil, nil, 3, 0},
		{"always conflicting", []error{conflict}, nil, ErrRetriesExhausted, 5, 0},
		{"commit unknown is not retried", []error{unknown}, nil, ErrCommitUnknown, 1, 0},
		{"fn error aborts", []error{nil}, errors.New("app"), nil, 1, 1},
		{"fn conflict retried", []error{nil}, conflict, ErrRetriesExhausted, 5, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := &scriptedDB{commits: c.commits}
			err := UpdateWith(ctx, db, fast, func(Txn) error { return c.fnErr })
			switch {
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("err = %v, want %v", err, c.want)
			case c.want == nil && c.fnErr != nil && !errors.Is(err, c.fnErr):
				t.Fatalf("err = %v, want the function's error", err)
			case c.want == nil && c.fnErr == nil && err != nil:
				t.Fatalf("err = %v", err)
			}
			if db.begun != c.begun || db.aborted != c.aborted {
				t.Fatalf("began %d, aborted %d; want %d, %d", db.begun, db.aborted, c.begun, c.aborted)
			}
		})
	}
}

func TestUpdateStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	db := &scriptedDB{commits: []error{&Error{Kind: ErrConflict}}}
	p := RetryPolicy{MaxAttempts: 100, BaseDelay: time.Hour, MaxDelay: time.Hour}
	time.AfterFunc(10*time.Millisecond, cancel)
	if err := UpdateWith(ctx, db, p, func(Txn) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestBackoffCeiling(t *testing.T) {
	var seen []time.Duration
	p := RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond,
		Jitter: func(c time.Duration) time.Duration { seen = append(seen, c); return 0 }}
	for i := range 6 {
		_ = p.Sleep(context.Background(), i)
	}
	want := []time.Duration{1, 2, 4, 8, 10, 10}
	for i := range want {
		if seen[i] != want[i]*time.Millisecond {
			t.Fatalf("ceilings %v, want %v ms", seen, want)
		}
	}
}

func TestUpdateAbortsOnPanic(t *testing.T) {
	db := &scriptedDB{commits: []error{nil}}
	func() {
		defer func() { _ = recover() }()
		_ = Update(context.Background(), db, func(Txn) error { panic("contract bug") })
	}()
	if db.aborted != 1 {
		t.Fatalf("a panicking fn left the transaction open (aborted %d)", db.aborted)
	}
}
