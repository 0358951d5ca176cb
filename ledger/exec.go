package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Result is what Execute returns (proof.Result): the transaction's signed
// receipt (with the contract's result) and one proof per asset version
// written, in id order.
type Result = proof.Result

// Execute verifies req, runs its contract in one strictly serializable
// transaction and returns the result with a signed proof per written
// version. The transaction is retried on conflicts by re-running the
// (deterministic) contract.
//
// A request that fails authentication (ErrBadRequest, ErrUnknownEntity,
// ErrBadSignature) or whose nonce was used (ErrNonceReused) changes nothing
// at all. A signed request that fails afterwards — a malformed argument, an
// unknown contract, fail(), the step limit, a size limit — writes no asset
// and records the nonce as aborted with the reason, so GetTxState answers
// for it and the nonce cannot be used again.
//
// Execute is three steps, which an Auditor takes apart: VerifyRequest;
// RunContract against the transaction's state; and the commit of the
// versions NewVersions makes, with their proofs.
func (l *Ledger) Execute(ctx context.Context, req *Request) (*Result, error) {
	if l.cfg.Auditor != nil {
		return nil, fmt.Errorf("%w: this ledger runs requests the Auditor ordered only", ErrOrderToken)
	}
	if err := l.VerifyRequest(ctx, req); err != nil {
		return nil, err
	}
	return l.execute(ctx, req)
}

// ExecuteOrdered is Execute for a ledger with an Auditor (Config.Auditor):
// it runs req only if tok is the Auditor's signed token for exactly req
// and its deadline has not passed; otherwise ErrOrderToken, and nothing
// changes. A ledger without an Auditor ignores tok.
func (l *Ledger) ExecuteOrdered(ctx context.Context, req *Request, tok *proof.OrderToken) (*Result, error) {
	if err := l.VerifyRequest(ctx, req); err != nil {
		return nil, err
	}
	if l.cfg.Auditor != nil {
		switch {
		case tok == nil:
			return nil, fmt.Errorf("%w: the request carries none", ErrOrderToken)
		case tok.Nonce != req.Nonce || !bytes.Equal(tok.Digest, proof.RequestDigest(req)):
			return nil, fmt.Errorf("%w: the token names another request", ErrOrderToken)
		case proof.Verify(l.cfg.Auditor, tok, tok.Signature) != nil:
			return nil, fmt.Errorf("%w: the token's signature does not verify with the Auditor's key", ErrOrderToken)
		case l.now().UnixMilli() > tok.Deadline:
			return nil, fmt.Errorf("%w: the token expired at %s", ErrOrderToken, time.UnixMilli(tok.Deadline).UTC().Format(time.RFC3339Nano))
		}
	}
	return l.execute(ctx, req)
}

func (l *Ledger) now() time.Time {
	if l.cfg.Now != nil {
		return l.cfg.Now()
	}
	return time.Now()
}

// VerifyRequest checks req's form against the ledger's limits and its
// signature against the key its entity enrolled: the errors Execute
// returns before running anything (ErrBadRequest, ErrUnknownEntity,
// ErrBadSignature).
func (l *Ledger) VerifyRequest(ctx context.Context, req *Request) error {
	if err := checkRequest(req, l.lim); err != nil {
		return err
	}
	v, err := l.verifier(ctx, req.Entity, req.KeyVersion)
	if err != nil {
		return err
	}
	return Verify(v, req, req.Signature)
}

// isExecutionFailure tells a request that ran and failed (its abort is
// recorded) from a replayed nonce, from a server too busy to run it
// (ErrOverloaded) and from failures of storage or the context (nothing is
// recorded). Every error a contract, its argument or a limit causes
// carries a ledger kind; runContract hands the store's own failures back
// as they are, which carry none.
func isExecutionFailure(err error) bool {
	return Kind(err) != "" && !errors.Is(err, ErrNonceReused) && !errors.Is(err, ErrOverloaded)
}

func (l *Ledger) execute(ctx context.Context, req *Request) (*Result, error) {
	load := func(id string) (Contract, error) { return l.contract(ctx, id) }
	var res *Result
	var failed error // the contract's own failure, recorded as an abort
	s := l.store()
	defer l.stores.Put(s)
	err := storage.UpdateWith(ctx, l.b, l.cfg.Retry, func(tx storage.Txn) error {
		res, failed = nil, nil
		s.begin(ctx, tx)
		defer s.end()
		out, err := runContract(ctx, l.lim, l.gate, load, s, req.ContractID, req.Argument)
		if err == nil {
			err = s.checkReply(req, out)
		}
		if isExecutionFailure(err) {
			// The abort is recorded in this transaction, so it commits
			// only if what the contract read was consistent (a failure
			// decided on a torn read is retried like any conflict), and
			// never beside another attempt's commit of the same nonce.
			failed = err
			st := &TxState{Nonce: req.Nonce, Status: TxAborted, Kind: Kind(err), Reason: storableText(err.Error(), maxReason), Contract: req.ContractID}
			return tx.Put(ctx, s.req.statePut(st))
		}
		if err != nil {
			return err
		}
		res, err = s.commit(req, out)
		return err
	})
	switch {
	case errors.Is(err, storage.ErrConditionNotMet):
		// The state's put found the nonce recorded (requests.statePut).
		return nil, fmt.Errorf("%w: %s", ErrNonceReused, req.Nonce)
	case err != nil:
		return nil, err
	case failed != nil:
		return nil, failed
	}
	return res, nil
}

// maxReason bounds an abort's recorded reason, in bytes: a contract's
// message (maxFailText) with the contract id and the kind's text before it.
const maxReason = maxFailText + 256

// Head is the latest version of an asset as a run read it: Age -1 when
// the asset has no version.
type Head struct {
	Age    int64
	Hash   []byte
	Output []byte
}

// AssetSource is the state a contract runs against: the ledger's storage
// transaction, or an Auditor's replica of the versions it validated.
type AssetSource interface {
	// Head returns the latest version of asset id.
	Head(ctx context.Context, id string) (Head, error)
	// Versions returns the versions of asset id that r selects, up to age
	// head (its latest), at most r.Limit of them.
	Versions(ctx context.Context, id string, head int64, r ScanRange) ([]AssetValue, error)
}

// Run is what a contract's run against an AssetSource did: its result, the
// age of every asset it read (Input, -1 for one without a version), the
// value of every asset it wrote, and the heads of the assets it read or
// wrote as it found them.
type Run struct {
	Result []byte
	Input  map[string]int64
	Writes map[string][]byte
	Heads  map[string]Head
}

// RunContract runs contract on argument against src, as the ledger runs a
// request inside its transaction: the step an Auditor takes on its own
// replica to learn what a request reads and writes, and what it should
// return. Errors are the ledger's: a contract's failure carries a kind
// (Kind), src's own failure is returned as it is.
func RunContract(ctx context.Context, lim Limits, load func(id string) (Contract, error), src AssetSource, contract string, argument []byte) (*Run, error) {
	lim = lim.withDefaults()
	st := &runState{ctx: ctx, src: src, maxWrites: lim.MaxWrites, heads: map[string]Head{}, input: map[string]int64{}, writes: map[string][]byte{}}
	out, err := runContract(ctx, lim, nil, load, st, contract, argument)
	if err != nil {
		return nil, err
	}
	return &Run{Result: out, Input: st.input, Writes: st.writes, Heads: st.heads}, nil
}

// NewVersions returns the hash-chained versions req's run writes, in id
// order, unsigned: the versions the ledger commits for it, and the ones
// an Auditor expects the ledger's proofs to name.
func NewVersions(req *Request, run *Run) []*Version {
	var out []*Version
	var kb [8]string
	for _, id := range appendSortedKeys(kb[:0], run.Writes) {
		out = append(out, newVersion(req, id, run.Heads[id], run.Input, run.Writes[id]))
	}
	return out
}

func newVersion(req *Request, id string, h Head, input map[string]int64, output []byte) *Version {
	v := &Version{ID: id, Age: h.Age + 1, Input: input, Output: output, Contract: req.ContractID,
		Argument: req.Argument, Nonce: req.Nonce, Entity: req.Entity, KeyVersion: req.KeyVersion,
		Signature: req.Signature, PrevHash: h.Hash}
	v.Hash = v.ComputeHash()
	return v
}

// runState is a contract's view of an AssetSource during one run: the
// heads it read, once each, the ages it read and the values it wrote.
type runState struct {
	ctx       context.Context
	src       AssetSource
	maxWrites int
	heads     map[string]Head
	input     map[string]int64
	writes    map[string][]byte
}

func (s *runState) head(id string) (Head, error) {
	if h, ok := s.heads[id]; ok {
		return h, nil
	}
	h, err := s.src.Head(s.ctx, id)
	if err != nil {
		return Head{}, err
	}
	s.heads[id] = h
	return h, nil
}

func (s *runState) get(id string) (*AssetValue, error) {
	h, err := s.head(id)
	if err != nil {
		return nil, err
	}
	if w, ok := s.writes[id]; ok {
		return &AssetValue{Age: h.Age + 1, Value: w}, nil
	}
	s.input[id] = h.Age
	if h.Age < 0 {
		return nil, nil
	}
	return &AssetValue{Age: h.Age, Value: h.Output}, nil
}

func (s *runState) put(id string, value []byte) error {
	if _, err := s.head(id); err != nil {
		return err
	}
	if _, ok := s.writes[id]; !ok && len(s.writes) >= s.maxWrites {
		return fmt.Errorf("%w: more than %d assets written in one transaction", ErrTooLarge, s.maxWrites)
	}
	s.writes[id] = value
	return nil
}

func (s *runState) scan(id string, r ScanRange) ([]AssetValue, error) {
	h, err := s.head(id)
	if err != nil {
		return nil, err
	}
	s.input[id] = h.Age
	return s.src.Versions(s.ctx, id, h.Age, r)
}

// txStore runs a contract against a storage transaction: it is the
// AssetSource of its own runState. The ledger keeps its spent ones for
// reuse (Ledger.stores), maps and requests included: begin and end empty
// what an attempt leaves. input alone is made anew, since the result
// keeps it.
type txStore struct {
	runState
	tx  storage.Txn
	l   *Ledger
	req *requests
}

// store returns a txStore for an execution, a spent one if there is one.
func (l *Ledger) store() *txStore {
	if s, ok := l.stores.Get().(*txStore); ok {
		return s
	}
	s := &txStore{l: l, req: newRequests(l.ns)}
	s.runState = runState{src: s, maxWrites: l.lim.MaxWrites, heads: map[string]Head{}, writes: map[string][]byte{}}
	return s
}

// begin readies s for an attempt in tx; end drops the heads it read and
// the values it wrote, so the next attempt starts from nothing. (Its
// requests keep their last values until refilled; every call sets all of
// a request's columns.)
func (s *txStore) begin(ctx context.Context, tx storage.Txn) {
	s.ctx, s.tx, s.input = ctx, tx, map[string]int64{}
}

func (s *txStore) end() {
	s.ctx, s.tx, s.input = nil, nil, nil
	clear(s.heads)
	clear(s.writes)
}

// Head reads the heads row of asset id in the transaction.
func (s *txStore) Head(ctx context.Context, id string) (Head, error) {
	row, ok, err := s.tx.Get(ctx, s.req.headOf(id))
	if err != nil {
		return Head{}, err
	}
	h := Head{Age: -1}
	if ok {
		rr := &rowReader{what: "head of " + id, r: row}
		h = Head{Age: rr.bigint("age"), Hash: rr.blob("hash"), Output: []byte(rr.text("output"))}
		if rr.err != nil {
			return Head{}, rr.err
		}
	}
	return h, nil
}

// Versions scans asset id's versions in the transaction.
func (s *txStore) Versions(ctx context.Context, id string, head int64, r ScanRange) ([]AssetValue, error) {
	return s.l.scanVersions(ctx, s.tx, id, head, r)
}

// checkReply refuses, before anything is written, a transaction whose
// reply would exceed MaxReplyBytes: every proof carries the whole input
// set, so the reply grows with writes × inputs, and a reply too big for
// the client would be lost after the commit.
func (s *txStore) checkReply(req *Request, result []byte) error {
	if n := ReplyBound(req, result, s.input, s.writes); n > s.l.lim.MaxReplyBytes {
		return fmt.Errorf("%w: the reply would be up to %d bytes (%d proofs, each with %d inputs), limit %d",
			ErrTooLarge, n, len(s.writes), len(s.input), s.l.lim.MaxReplyBytes)
	}
	return nil
}

// ReplyBound bounds the encoded size of the reply to req, whose contract
// returned result, read input and wrote the assets of writes: the receipt
// and one proof per write, each carrying the whole input set. The ledger
// refuses a transaction whose bound passes Limits.MaxReplyBytes.
func ReplyBound[V any](req *Request, result []byte, input map[string]int64, writes map[string]V) int {
	inputs := 0
	for id := range input {
		inputs += len(id) + entryOverhead
	}
	// The receipt (its writes travel as the proofs): nonce, contract,
	// result, input set, signature.
	n := len(req.Nonce) + len(req.ContractID) + len(result) + inputs + sigBytes + 64
	for id := range writes {
		n += len(id) + len(req.Nonce) + inputs + proofOverhead
	}
	return n
}

// Bounds of the protobuf encoding of a reply's parts, beyond their
// strings' bytes: sigBytes is an ECDSA P-256 signature in ASN.1 (at most
// 72 bytes) with its tag and length; entryOverhead is an id→age entry's
// tags and lengths (an id's length takes at most 2 bytes) and its age (a
// varint, 10 bytes for the -1 of an absent input); proofOverhead is a
// proof's age, two SHA-256 hashes, signature and field tags and lengths.
const (
	sigBytes      = 72 + 3
	entryOverhead = 3 + 2 + 1 + 10 + 1
	proofOverhead = 11 + 2*(32+2) + sigBytes + 3*3 + 4
	// versionOverhead bounds a version's encoding beyond its strings'
	// and input entries' bytes: its own tag and length (6), the tag and
	// length of each of its ten other length-prefixed fields (6 each),
	// its age (11) and its key version (6).
	versionOverhead = 6 + 10*6 + 11 + 6
	// historyReplyOverhead bounds a History reply's fields besides its
	// versions: its limit (6) and truncated flag (2).
	historyReplyOverhead = 6 + 2
)

// EncodedBound bounds the size of v's protobuf encoding as an element of
// a reply (api.AssetVersion), which History keeps within MaxReplyBytes.
func EncodedBound(v *Version) int {
	n := versionOverhead + len(v.ID) + len(v.Output) + len(v.Contract) + len(v.Argument) + len(v.Nonce) + len(v.Entity) +
		len(v.Signature) + len(v.PrevHash) + len(v.Hash) + len(v.ProofSignature)
	for id := range v.Input {
		n += len(id) + entryOverhead
	}
	return n
}

// commit turns the transaction's writes into hash-chained versions, writes
// them with their heads and the committed state, and returns the proofs.
func (s *txStore) commit(req *Request, result []byte) (*Result, error) {
	res := &Result{Receipt: Receipt{Nonce: req.Nonce, Contract: req.ContractID, Input: s.input, Result: result}}
	writes := make(map[string]int64, len(s.writes))
	var kb [8]string
	for _, id := range appendSortedKeys(kb[:0], s.writes) {
		v := newVersion(req, id, s.heads[id], s.input, s.writes[id])
		p := v.Proof()
		sig, err := Sign(s.l.cfg.Signer, &p)
		if err != nil {
			return nil, fmt.Errorf("ledger: signing the proof of %s: %w", id, err)
		}
		v.ProofSignature, p.Signature = sig, sig
		// Unconditional: the head was read in this transaction, so no
		// other version v.Age can commit beside this one.
		if err := s.tx.Put(s.ctx, s.req.versionPut(v)); err != nil {
			return nil, err
		}
		if err := s.tx.Put(s.ctx, s.req.headPut(v)); err != nil {
			return nil, err
		}
		writes[id] = v.Age
		res.Proofs = append(res.Proofs, p)
	}
	res.Writes = writes
	sig, err := Sign(s.l.cfg.Signer, &res.Receipt)
	if err != nil {
		return nil, fmt.Errorf("ledger: signing the receipt of %s: %w", req.Nonce, err)
	}
	res.Signature = sig
	st := &TxState{Nonce: req.Nonce, Status: TxCommitted, Contract: req.ContractID, Result: result, Writes: writes,
		Input: s.input, Signature: sig}
	if err := s.tx.Put(s.ctx, s.req.statePut(st)); err != nil {
		return nil, err
	}
	return res, nil
}

func (l *Ledger) versionGet(id string, age int64, cols ...string) *storage.Get {
	return &storage.Get{Namespace: l.ns, Table: tAssets, Partition: storage.Values{"id": storage.Text(id)},
		Clustering: storage.Values{"age": storage.BigInt(age)}, Projection: cols}
}

// reader is what both a transaction and the backend offer for reads.
type reader interface {
	Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error)
	Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error)
}

// scanVersions returns the values of id's versions in r, up to age latest.
func (l *Ledger) scanVersions(ctx context.Context, rd reader, id string, latest int64, r ScanRange) ([]AssetValue, error) {
	rows, err := l.scanRows(ctx, rd, id, latest, r, "age", "output")
	if err != nil {
		return nil, err
	}
	out := make([]AssetValue, len(rows))
	for i, row := range rows {
		rr := &rowReader{what: "asset " + id, r: row}
		out[i] = AssetValue{Age: rr.bigint("age"), Value: []byte(rr.text("output"))}
		if rr.err != nil {
			return nil, rr.err
		}
	}
	return out, nil
}

func (l *Ledger) scanRows(ctx context.Context, rd reader, id string, latest int64, r ScanRange, cols ...string) ([]storage.Row, error) {
	rows, err := l.openScan(ctx, rd, id, latest, r, cols...)
	if err != nil || rows == nil {
		return nil, err
	}
	return storage.CollectRows(rows)
}

// openScan starts the scan of r's versions of id, of which latest is the
// newest; nil rows for an empty range.
func (l *Ledger) openScan(ctx context.Context, rd reader, id string, latest int64, r ScanRange, cols ...string) (storage.Rows, error) {
	end := r.End
	if end < 0 || end > latest {
		end = latest
	}
	if r.Start > end {
		return nil, nil
	}
	order := storage.Asc
	if !r.Ascending {
		order = storage.Desc
	}
	return rd.Scan(ctx, &storage.Scan{Namespace: l.ns, Table: tAssets, Partition: storage.Values{"id": storage.Text(id)},
		Start:      &storage.Bound{Key: storage.Values{"age": storage.BigInt(r.Start)}, Inclusive: true},
		End:        &storage.Bound{Key: storage.Values{"age": storage.BigInt(end)}, Inclusive: true},
		Order:      order,
		Limit:      r.Limit,
		Projection: cols})
}

// ---- reads outside transactions ----

// Latest returns the latest age of asset id, or -1 if it has none.
func (l *Ledger) Latest(ctx context.Context, id string) (int64, error) {
	if err := checkAssetID(id); err != nil {
		return 0, err
	}
	row, ok, err := l.b.Get(ctx, &storage.Get{Namespace: l.ns, Table: tHeads, Partition: storage.Values{"id": storage.Text(id)}, Projection: []string{"age"}})
	if err != nil || !ok {
		return -1, err
	}
	rr := &rowReader{what: "head of " + id, r: row}
	age := rr.bigint("age")
	return age, rr.err
}

// Version returns version age of asset id, or ErrNotFound.
func (l *Ledger) Version(ctx context.Context, id string, age int64) (*Version, error) {
	if err := checkAssetID(id); err != nil {
		return nil, err
	}
	row, ok, err := l.b.Get(ctx, l.versionGet(id, age))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: asset %s has no version %d", ErrNotFound, id, age)
	}
	row["age"] = storage.BigInt(age)
	return rowVersion(id, row)
}

// A HistoryPage is what one History call returns of a range.
type HistoryPage struct {
	Versions []*Version
	// Limit is the most versions the call could return: the range's
	// Limit, capped at MaxScanLimit.
	Limit int
	// Truncated says the reply budget (MaxReplyBytes) ended the page
	// before Limit versions and before the range's end: the scan had
	// another version of the range after the last one, which did not fit.
	Truncated bool
}

// History returns the versions of asset id in r: at most r.Limit (the
// scan cap if 0 or above it), and fewer if their encoding would pass
// MaxReplyBytes, so that a reply stays within what a client receives. It
// always returns at least one version of a range that has one: a stored
// version's encoding is bounded well below the client's limit (its input
// set by the execute reply's bound, its value and argument by theirs). An
// asset with no version at all is ErrNotFound, as it is for Proof and
// Version; a range of an existing asset that holds none is an empty page.
func (l *Ledger) History(ctx context.Context, id string, r ScanRange) (*HistoryPage, error) {
	if err := checkAssetID(id); err != nil {
		return nil, err
	}
	if r.Start < 0 {
		return nil, fmt.Errorf("%w: start age %d is negative", ErrBadRequest, r.Start)
	}
	if r.Limit <= 0 || r.Limit > l.lim.MaxScanLimit {
		r.Limit = l.lim.MaxScanLimit
	}
	page := &HistoryPage{Limit: r.Limit}
	if err := l.historyPage(ctx, id, r, page); err != nil {
		return nil, err
	}
	if len(page.Versions) == 0 {
		// An asset with no version is not found, as GetProof says; an
		// asset's range past its latest version is an empty page.
		latest, err := l.Latest(ctx, id)
		if err != nil {
			return nil, err
		}
		if latest < 0 {
			return nil, fmt.Errorf("%w: asset %s has no version", ErrNotFound, id)
		}
	}
	return page, nil
}

// historyPage fills page with the versions of asset id in r.
func (l *Ledger) historyPage(ctx context.Context, id string, r ScanRange, page *HistoryPage) error {
	rows, err := l.openScan(ctx, l.b, id, math.MaxInt64, r)
	if err != nil || rows == nil {
		return err
	}
	defer rows.Close()
	size := historyReplyOverhead
	for rows.Next() {
		v, err := rowVersion(id, rows.Row())
		if err != nil {
			return err
		}
		n := EncodedBound(v)
		if len(page.Versions) > 0 && size+n > l.lim.MaxReplyBytes {
			page.Truncated = true
			break
		}
		size += n
		page.Versions = append(page.Versions, v)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// Proof returns the stored proof of version age of asset id.
func (l *Ledger) Proof(ctx context.Context, id string, age int64) (*Proof, error) {
	v, err := l.Version(ctx, id, age)
	if err != nil {
		return nil, err
	}
	p := v.Proof()
	return &p, nil
}

// VerifyProof checks the ledger's signature on p.
func (l *Ledger) VerifyProof(p *Proof) error {
	return Verify(l.cfg.ProofVerifier, p, p.Signature)
}

// VerifyReceipt checks the ledger's signature on r.
func (l *Ledger) VerifyReceipt(r *Receipt) error {
	return Verify(l.cfg.ProofVerifier, r, r.Signature)
}
