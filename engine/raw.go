package engine

import (
	"context"

	"github.com/kiroku-db/kiroku/storage"
)

// The raw API runs transactions on encoded keys and value-column slices,
// without the storage API's maps and validation. It is for benchmarks and
// bulk loading by code that has validated its input; rows must match the
// table's value columns in number and type.

// TableHandle is a resolved table for the raw API.
type TableHandle struct{ t *table }

// Table resolves a table for the raw API.
func (db *DB) Table(ns, name string) (*TableHandle, error) {
	t, err := db.cat.lookup("table", ns, name)
	if err != nil {
		return nil, err
	}
	return &TableHandle{t}, nil
}

// PartitionKey encodes a partition key given in schema order.
func (h *TableHandle) PartitionKey(vals ...storage.Value) string {
	return string(h.AppendPartitionKey(nil, vals...))
}

// AppendPartitionKey appends the encoding of a partition key given in
// schema order to b.
func (h *TableHandle) AppendPartitionKey(b []byte, vals ...storage.Value) []byte {
	for _, v := range vals {
		b = appendKeyValue(b, v, false)
	}
	return b
}

// RawTxn is a reusable raw transaction on tables without clustering keys.
//
// The key strings given to Read, Write and WriteRow must stay unchanged
// until the commit returns or Reset is called; after that the caller may
// reuse their bytes (for example, strings made with unsafe.String over one
// buffer), because the engine copies every key it keeps. A caller that
// encodes its keys into such a buffer allocates nothing per operation.
type RawTxn struct {
	x tx
}

// BeginRaw starts a raw transaction.
func (db *DB) BeginRaw() *RawTxn { return &RawTxn{x: tx{db: db}} }

// Pin makes every commit of the transaction run on one worker, taken now
// and held until Unpin, as a Silo worker thread owns its worker: its log
// buffer and last TID stay in one core's cache, and a commit skips the
// shared queue of free workers. A pinned transaction holds one of
// Config.Workers, so a program pins fewer than that and unpins when done.
func (r *RawTxn) Pin(ctx context.Context) error {
	if r.x.pinned != nil {
		return nil
	}
	select {
	case r.x.pinned = <-r.x.db.slots:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Unpin gives the pinned worker back.
func (r *RawTxn) Unpin() {
	if r.x.pinned != nil {
		r.x.db.slots <- r.x.pinned
		r.x.pinned = nil
	}
}

// Reset makes the transaction empty again, keeping its buffers.
func (r *RawTxn) Reset() { r.x.reset() }

// Read returns the row of partition key pk as the transaction sees it.
// The slice is the transaction's until Reset; its values stay valid.
func (r *RawTxn) Read(h *TableHandle, pk string) ([]storage.Value, bool) {
	cols := r.x.get(h.t, pk, "")
	return cols, cols != nil
}

// Write sets the whole row of partition key pk.
func (r *RawTxn) Write(h *TableHandle, pk string, cols []storage.Value) {
	r.x.put(h.t, pk, "", cols, nil)
}

// RawRow is an immutable row built once and written any number of times.
type RawRow struct{ r *row }

// NewRawRow builds a row from its value columns, in schema order: it is
// encoded here, once.
func NewRawRow(cols []storage.Value) RawRow {
	return RawRow{newRow(cols)}
}

// WriteRow sets the whole row of partition key pk to a prebuilt row.
func (r *RawTxn) WriteRow(h *TableHandle, pk string, row RawRow) {
	r.x.putRow(h.t, pk, "", row.r)
}

// CommitAsync commits without waiting for durability and returns the
// epoch to pass to WaitDurable (0 for a transaction that read nothing).
func (r *RawTxn) CommitAsync(ctx context.Context) (uint64, error) {
	return r.x.commit(ctx)
}
