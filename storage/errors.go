package storage

import (
	"errors"
	"strings"
)

// Sentinel errors. Every error a backend returns for bad input, a failed
// condition or a conflict is an *Error whose Kind is one of these, so callers
// test with errors.Is(err, storage.ErrTableNotFound) and read the details from
// the *Error when they need them.
var (
	// Schema and name errors.
	ErrInvalidName       = errors.New("invalid name")
	ErrInvalidSchema     = errors.New("invalid table schema")
	ErrNamespaceExists   = errors.New("namespace already exists")
	ErrNamespaceNotFound = errors.New("namespace not found")
	ErrNamespaceNotEmpty = errors.New("namespace is not empty")
	ErrTableExists       = errors.New("table already exists")
	ErrTableNotFound     = errors.New("table not found")

	// Operation errors: the request does not fit the table's schema or limits.
	ErrUnknownColumn   = errors.New("unknown column")
	ErrInvalidKey      = errors.New("invalid key")
	ErrTypeMismatch    = errors.New("value has the wrong type")
	ErrInvalidValue    = errors.New("invalid value")
	ErrInvalidBound    = errors.New("invalid scan bound")
	ErrTooLarge        = errors.New("over the size limit")
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrConditionNotMet is returned by a conditional Put or Delete (and by
	// Mutate) whose condition did not hold. Nothing was written.
	ErrConditionNotMet = errors.New("condition not met")

	// ErrConflict means a transaction (or a single operation) lost a race with
	// a concurrent one and was rolled back. It is retryable: Update retries it.
	ErrConflict = errors.New("transaction conflict")
	// ErrUnavailable means the backend could not be reached or refused the
	// work for now (connection refused or lost before commit, shutting down).
	// Nothing was committed; it is retryable.
	ErrUnavailable = errors.New("backend unavailable")
	// ErrCommitUnknown means the connection failed while a commit was in
	// flight: the transaction may or may not have committed. It is NOT
	// retried automatically, because a retry could apply the work twice.
	ErrCommitUnknown = errors.New("commit outcome unknown")
	// ErrNotLeader means the backend is a replica that follows another's
	// log: it serves reads, and refuses writes and catalog changes, which
	// go to the leader. Nothing was done; retrying here does not help.
	ErrNotLeader = errors.New("not the leader")
	// ErrTxnDone is returned by any use of a transaction after Commit, Abort
	// or an error that rolled it back.
	ErrTxnDone = errors.New("transaction already finished")
	// ErrClosed is returned after the backend was closed.
	ErrClosed = errors.New("backend closed")
)

// Error is the error type of the storage API. Kind is one of the sentinel
// errors above; the other fields say where the problem was.
type Error struct {
	Kind      error  // a sentinel from this package
	Op        string // the operation: "get", "scan", "put", "create table", ...
	Namespace string
	Table     string
	Column    string // the column at fault, if any
	Detail    string // a human explanation
	Cause     error  // the underlying driver error, if any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("storage")
	if e.Op != "" {
		b.WriteString(": ")
		b.WriteString(e.Op)
	}
	if e.Namespace != "" || e.Table != "" {
		b.WriteString(" ")
		b.WriteString(e.Namespace)
		if e.Table != "" {
			b.WriteString(".")
			b.WriteString(e.Table)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if e.Column != "" {
		b.WriteString(": column ")
		b.WriteString(e.Column)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// Unwrap exposes both the sentinel and the cause to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Kind, e.Cause}
	}
	return []error{e.Kind}
}

// IsRetryable reports whether err leaves nothing committed and may succeed if
// the same work is tried again: ErrConflict and ErrUnavailable.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrUnavailable)
}

// errorf builds an *Error without a table context; the caller fills in the rest.
func newError(kind error, op, column, detail string) *Error {
	return &Error{Kind: kind, Op: op, Column: column, Detail: detail}
}

// WithOp names op as the operation of err, a *Error that names none, and
// returns err: for a backend that learns the operation after the error.
func WithOp(err error, op string) error {
	var se *Error
	if errors.As(err, &se) && se.Op == "" {
		se.Op = op
	}
	return err
}
