package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kiroku-db/kiroku/storage"
)

// The ledger's tables, all in one namespace (Config.Namespace):
//
//	assets      (id | age ASC) → input, output, contract, argument, nonce,
//	            entity, key_version, signature, prev_hash, hash, proof_sig
//	heads       (id) → age, hash, output: the latest version of each asset,
//	            so that a contract's get is one read (validation reads the
//	            versions themselves, so a head edited behind the ledger's
//	            back shows up as a re-execution that diverges)
//	contracts   (bucket | id ASC) → source, entity, key_version, signature;
//	            one partition, so the registry can be listed with a scan
//	identities  (entity | key_version ASC) → scheme, material (a PEM
//	            certificate, or a secret sealed under the server key)
//	tx_states   (nonce) → state, kind, reason, contract, result, writes,
//	            input, signature (the receipt's, for committed ones)
const (
	// DefaultNamespace is the namespace of the ledger's tables unless
	// Config.Namespace says otherwise.
	DefaultNamespace = "ledger"
	// AssetsTable holds the asset versions, partition "id", clustering "age".
	AssetsTable = tAssets

	tAssets     = "assets"
	tHeads      = "heads"
	tContracts  = "contracts"
	tIdentities = "identities"
	tTxStates   = "tx_states"

	contractBucket = "c"
)

func ledgerTables(ns string) []*storage.Table {
	text := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeText} }
	blob := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeBlob} }
	bigint := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeBigInt} }
	return []*storage.Table{
		{Namespace: ns, Name: tAssets,
			PartitionKey:  []storage.Column{text("id")},
			ClusteringKey: []storage.ClusteringColumn{{Name: "age", Type: storage.TypeBigInt, Order: storage.Asc}},
			Columns: []storage.Column{text("input"), text("output"), text("contract"), blob("argument"), text("nonce"),
				text("entity"), bigint("key_version"), blob("signature"), blob("prev_hash"), blob("hash"), blob("proof_sig")}},
		{Namespace: ns, Name: tHeads,
			PartitionKey: []storage.Column{text("id")},
			Columns:      []storage.Column{bigint("age"), blob("hash"), text("output")}},
		{Namespace: ns, Name: tContracts,
			PartitionKey:  []storage.Column{text("bucket")},
			ClusteringKey: []storage.ClusteringColumn{{Name: "id", Type: storage.TypeText, Order: storage.Asc}},
			Columns:       []storage.Column{blob("source"), text("entity"), bigint("key_version"), blob("signature")}},
		{Namespace: ns, Name: tIdentities,
			PartitionKey:  []storage.Column{text("entity")},
			ClusteringKey: []storage.ClusteringColumn{{Name: "key_version", Type: storage.TypeBigInt, Order: storage.Asc}},
			Columns:       []storage.Column{bigint("scheme"), blob("material")}},
		{Namespace: ns, Name: tTxStates,
			PartitionKey: []storage.Column{text("nonce")},
			Columns: []storage.Column{text("state"), text("kind"), text("reason"), text("contract"), text("result"), text("writes"),
				text("input"), blob("signature")}},
	}
}

// ensureSchema creates the namespace and tables that are missing and checks
// that the ones present have the ledger's schema.
func ensureSchema(ctx context.Context, b storage.Backend, ns string) error {
	if err := b.CreateNamespace(ctx, ns); err != nil && !errors.Is(err, storage.ErrNamespaceExists) {
		return fmt.Errorf("ledger: create namespace %s: %w", ns, err)
	}
	for _, t := range ledgerTables(ns) {
		err := b.CreateTable(ctx, t)
		if err == nil {
			continue
		}
		if !errors.Is(err, storage.ErrTableExists) {
			return fmt.Errorf("ledger: create table %s.%s: %w", ns, t.Name, err)
		}
		have, err := b.DescribeTable(ctx, ns, t.Name)
		if err != nil {
			return fmt.Errorf("ledger: describe %s.%s: %w", ns, t.Name, err)
		}
		if !have.Equal(t) {
			return fmt.Errorf("ledger: table %s.%s exists with another schema", ns, t.Name)
		}
	}
	return nil
}

// versionRow and rowVersion convert between a Version and its assets row.
func (l *Ledger) versionPut(v *Version) (*storage.Put, error) {
	input, err := json.Marshal(v.Input)
	if err != nil {
		return nil, err
	}
	return &storage.Put{Namespace: l.ns, Table: tAssets,
		Partition:  storage.Values{"id": storage.Text(v.ID)},
		Clustering: storage.Values{"age": storage.BigInt(v.Age)},
		Values: storage.Values{
			"input": storage.Text(string(input)), "output": storage.Text(string(v.Output)),
			"contract": storage.Text(v.Contract), "argument": storage.Blob(v.Argument),
			"nonce": storage.Text(v.Nonce), "entity": storage.Text(v.Entity),
			"key_version": storage.BigInt(int64(v.KeyVersion)), "signature": storage.Blob(v.Signature),
			"prev_hash": storage.Blob(v.PrevHash), "hash": storage.Blob(v.Hash), "proof_sig": storage.Blob(v.ProofSignature),
		},
		Condition: storage.IfNotExists(),
	}, nil
}

func rowVersion(id string, r storage.Row) (*Version, error) {
	v := &Version{ID: id}
	get := func(col string, t storage.DataType) (storage.Value, error) {
		x, ok := r[col]
		if !ok || x.IsNull() || x.Type() != t {
			return storage.Value{}, fmt.Errorf("ledger: asset %s: column %s is missing or NULL", id, col)
		}
		return x, nil
	}
	var errs []error
	str := func(col string) string {
		x, err := get(col, storage.TypeText)
		errs = append(errs, err)
		return x.Content()
	}
	blob := func(col string) []byte {
		x, err := get(col, storage.TypeBlob)
		errs = append(errs, err)
		return []byte(x.Content())
	}
	num := func(col string) int64 {
		x, err := get(col, storage.TypeBigInt)
		if err != nil {
			errs = append(errs, err)
			return 0
		}
		return x.AsBigInt()
	}
	v.Age = num("age")
	input := str("input")
	v.Output = []byte(str("output"))
	v.Contract = str("contract")
	v.Argument = blob("argument")
	v.Nonce = str("nonce")
	v.Entity = str("entity")
	v.KeyVersion = uint32(num("key_version"))
	v.Signature = blob("signature")
	v.PrevHash = blob("prev_hash")
	v.Hash = blob("hash")
	v.ProofSignature = blob("proof_sig")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(input), &v.Input); err != nil {
		return nil, fmt.Errorf("ledger: asset %s age %d: input: %w", id, v.Age, err)
	}
	return v, nil
}
