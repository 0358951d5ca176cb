package auditor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// The orders table holds every request the Auditor ordered and has not
// settled, in one partition so that a restart reads them all: the request
// as the client signed it and its token's deadline.
const tOrders = "orders"

func ordersTable(ns string) *storage.Table {
	return &storage.Table{Namespace: ns, Name: tOrders,
		PartitionKey:  []storage.Column{{Name: "bucket", Type: storage.TypeText}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "nonce", Type: storage.TypeText, Order: storage.Asc}},
		Columns: []storage.Column{{Name: "contract", Type: storage.TypeText}, {Name: "argument", Type: storage.TypeBlob},
			{Name: "entity", Type: storage.TypeText}, {Name: "key_version", Type: storage.TypeBigInt},
			{Name: "signature", Type: storage.TypeBlob}, {Name: "deadline", Type: storage.TypeBigInt}}}
}

var ordersBucket = storage.Values{"bucket": storage.Text("o")}

func orderPut(ns string, o *order) *storage.Put {
	r := o.req
	return &storage.Put{Namespace: ns, Table: tOrders, Partition: ordersBucket, Clustering: storage.Values{"nonce": storage.Text(r.Nonce)},
		Values: storage.Values{"contract": storage.Text(r.ContractID), "argument": storage.Blob(r.Argument), "entity": storage.Text(r.Entity),
			"key_version": storage.BigInt(int64(r.KeyVersion)), "signature": storage.Blob(r.Signature), "deadline": storage.BigInt(o.token.Deadline)}}
}

func orderDelete(ns, nonce string) *storage.Delete {
	return &storage.Delete{Namespace: ns, Table: tOrders, Partition: ordersBucket, Clustering: storage.Values{"nonce": storage.Text(nonce)}}
}

// reload takes up the orders a previous run left. They did not conflict
// (each held its locks), and the replica has not moved under them (only
// their validations move it), so each runs again to what it ran to then
// and takes its locks at once. One whose nonce the replica has recorded
// was settled before the crash forgot its row.
func (a *Auditor) reload(ctx context.Context) error {
	it, err := a.cfg.DB.Scan(ctx, &storage.Scan{Namespace: a.cfg.Namespace, Table: tOrders, Partition: ordersBucket})
	if err != nil {
		return fmt.Errorf("auditor: reading its orders: %w", err)
	}
	rows, err := storage.CollectRows(it)
	if err != nil {
		return fmt.Errorf("auditor: reading its orders: %w", err)
	}
	rep := a.cfg.Replica
	for _, row := range rows {
		req := &proof.Request{Nonce: row["nonce"].AsText(), ContractID: row["contract"].AsText(), Argument: row["argument"].AsBlob(),
			Entity: row["entity"].AsText(), KeyVersion: uint32(row["key_version"].AsBigInt()), Signature: row["signature"].AsBlob()}
		tok := &proof.OrderToken{Nonce: req.Nonce, Digest: proof.RequestDigest(req), Deadline: row["deadline"].AsBigInt()}
		o := &order{req: req, digest: tok.Digest, token: tok}
		if st, err := rep.TxState(ctx, req.Nonce); err != nil {
			return err
		} else if st.Status != ledger.TxUnknown {
			if err := a.cfg.DB.Delete(ctx, orderDelete(a.cfg.Namespace, req.Nonce)); err != nil {
				return err
			}
			continue
		}
		run, err := ledger.RunContract(ctx, rep.Limits(), rep.Loader(ctx), rep.Source(), req.ContractID, req.Argument)
		if err != nil {
			return fmt.Errorf("auditor: running the order of %s again: %w", req.Nonce, err)
		}
		o.run, o.versions = run, ledger.NewVersions(req, run)
		lease := time.UnixMilli(tok.Deadline).Sub(a.cfg.Now())
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = a.locks.acquire(lctx, req.Nonce, slices.Collect(maps.Keys(run.Input)), slices.Collect(maps.Keys(run.Writes)), lease)
		cancel()
		if err != nil {
			return fmt.Errorf("auditor: the order of %s takes its locks again: %w", req.Nonce, err)
		}
		a.order[req.Nonce] = o
	}
	return nil
}
