package ledger

import (
	"context"
	"encoding/json"
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
// that the ones present have the ledger's schema (storage.EnsureTables).
func ensureSchema(ctx context.Context, b storage.Backend, ns string) error {
	if err := storage.EnsureTables(ctx, b, ns, ledgerTables(ns)); err != nil {
		return fmt.Errorf("ledger: schema of %s: %w", ns, err)
	}
	return nil
}

// requests are an execution attempt's storage requests, refilled for each
// call: a backend keeps no reference to a request once the call returns
// (package storage), and building a map per request, ten an execute, was a
// third of what an execute allocated. Every call sets all of a request's
// keys, so nothing of the previous one is left.
type requests struct {
	headGet storage.Get // the heads row of an asset
	version storage.Put // an asset version
	head    storage.Put // the heads row of an asset
	state   storage.Put // a transaction's state
	buf     []byte      // scratch for an age map's JSON
}

func newRequests(ns string) *requests {
	id := func() storage.Values { return make(storage.Values, 1) }
	return &requests{
		headGet: storage.Get{Namespace: ns, Table: tHeads, Partition: id()},
		version: storage.Put{Namespace: ns, Table: tAssets, Partition: id(), Clustering: make(storage.Values, 1), Values: make(storage.Values, 11)},
		head:    storage.Put{Namespace: ns, Table: tHeads, Partition: id(), Values: make(storage.Values, 3)},
		// The state's condition is what refuses a reused nonce (statePut).
		state: storage.Put{Namespace: ns, Table: tTxStates, Partition: make(storage.Values, 1), Values: make(storage.Values, 8),
			Condition: storage.IfNotExists(), Deferred: true},
	}
}

// ageMap returns m's JSON (AppendAgeMapJSON) as TEXT; "" for a nil m.
func (r *requests) ageMap(m map[string]int64) storage.Value {
	if m == nil {
		return storage.Text("")
	}
	r.buf = AppendAgeMapJSON(r.buf[:0], m)
	return storage.Text(string(r.buf))
}

// headOf is the Get of asset id's heads row.
func (r *requests) headOf(id string) *storage.Get {
	r.headGet.Partition["id"] = storage.Text(id)
	return &r.headGet
}

// versionPut is the Put of v's assets row.
func (r *requests) versionPut(v *Version) *storage.Put {
	p := &r.version
	p.Partition["id"] = storage.Text(v.ID)
	p.Clustering["age"] = storage.BigInt(v.Age)
	vs := p.Values
	vs["input"], vs["output"] = r.ageMap(v.Input), storage.Text(string(v.Output))
	vs["contract"], vs["argument"] = storage.Text(v.Contract), storage.Blob(v.Argument)
	vs["nonce"], vs["entity"] = storage.Text(v.Nonce), storage.Text(v.Entity)
	vs["key_version"], vs["signature"] = storage.BigInt(int64(v.KeyVersion)), storage.Blob(v.Signature)
	vs["prev_hash"], vs["hash"], vs["proof_sig"] = storage.Blob(v.PrevHash), storage.Blob(v.Hash), storage.Blob(v.ProofSignature)
	return p
}

// headPut is the Put of v's heads row, which makes it its asset's latest
// version.
func (r *requests) headPut(v *Version) *storage.Put {
	p := &r.head
	p.Partition["id"] = storage.Text(v.ID)
	p.Values["age"], p.Values["hash"], p.Values["output"] = storage.BigInt(v.Age), storage.Blob(v.Hash), storage.Text(string(v.Output))
	return p
}

// statePut records st, on condition that the nonce has no state yet:
// this is what refuses a reused nonce, in the transaction that executed
// it, so nothing that transaction wrote commits. The condition is
// Deferred: on PostgreSQL the INSERT then goes with COMMIT, where reading
// the nonce first cost a round trip of its own. A replay so runs its
// contract before it is refused; an honest client replays only a request
// whose reply it lost.
func (r *requests) statePut(st *TxState) *storage.Put {
	p := &r.state
	p.Partition["nonce"] = storage.Text(st.Nonce)
	vs := p.Values
	vs["state"], vs["kind"], vs["reason"] = storage.Text(string(st.Status)), storage.Text(st.Kind), storage.Text(st.Reason)
	vs["contract"], vs["result"] = storage.Text(st.Contract), storage.Text(string(st.Result))
	vs["writes"], vs["input"], vs["signature"] = r.ageMap(st.Writes), r.ageMap(st.Input), storage.Blob(st.Signature)
	return p
}

// rowReader reads the typed columns of a stored row. Storage enforces
// column types, but a column can be NULL (a row written by hand, or by an
// older schema): the first such column is remembered instead of letting an
// accessor panic in the server.
type rowReader struct {
	what string // the row, for the error
	r    storage.Row
	err  error
}

func (rr *rowReader) value(col string, t storage.DataType) (storage.Value, bool) {
	x, ok := rr.r[col]
	if !ok || x.IsNull() || x.Type() != t {
		if rr.err == nil {
			rr.err = fmt.Errorf("ledger: %s: column %s is missing or NULL", rr.what, col)
		}
		return storage.Value{}, false
	}
	return x, true
}

func (rr *rowReader) text(col string) string {
	x, _ := rr.value(col, storage.TypeText)
	return x.Content()
}

func (rr *rowReader) blob(col string) []byte {
	x, ok := rr.value(col, storage.TypeBlob)
	if !ok {
		return nil
	}
	return []byte(x.Content())
}

func (rr *rowReader) bigint(col string) int64 {
	if x, ok := rr.value(col, storage.TypeBigInt); ok {
		return x.AsBigInt()
	}
	return 0
}

// ages decodes a JSON id → age map column ("" for none).
func (rr *rowReader) ages(col string) map[string]int64 {
	s := rr.text(col)
	if s == "" || rr.err != nil {
		return nil
	}
	var m map[string]int64
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		rr.err = fmt.Errorf("ledger: %s: %s: %w", rr.what, col, err)
	}
	return m
}

// rowVersion reads the version of asset id from its assets row, as
// requests.versionPut wrote it.
func rowVersion(id string, r storage.Row) (*Version, error) {
	rr := &rowReader{what: "asset " + id, r: r}
	v := &Version{ID: id, Age: rr.bigint("age"), Output: []byte(rr.text("output")), Contract: rr.text("contract"),
		Argument: rr.blob("argument"), Nonce: rr.text("nonce"), Entity: rr.text("entity"),
		KeyVersion: uint32(rr.bigint("key_version")), Signature: rr.blob("signature"), PrevHash: rr.blob("prev_hash"),
		Hash: rr.blob("hash"), ProofSignature: rr.blob("proof_sig")}
	v.Input = rr.ages("input")
	if v.Input == nil && rr.err == nil {
		v.Input = map[string]int64{}
	}
	return v, rr.err
}
