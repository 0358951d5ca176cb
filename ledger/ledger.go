package ledger

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/hmac"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Config configures a Ledger.
type Config struct {
	// Backend stores everything; the ledger uses only the storage API.
	Backend storage.Backend
	// Namespace holds the ledger's tables; "" means DefaultNamespace.
	Namespace string
	// Signer signs proofs with the ledger's key; required.
	Signer auth.Signer
	// ProofVerifier checks the ledger's own proof signatures when
	// validating; required.
	ProofVerifier auth.Verifier
	// Secrets seals registered HMAC secrets at rest. nil disables HMAC
	// identities: registering one fails, and so does verifying with one.
	Secrets *auth.SecretBox
	// Limits bound executions; zero fields take their defaults.
	Limits Limits
	// Retry bounds the retries of a conflicting transaction.
	Retry storage.RetryPolicy
	// Auditor, if set, is the key of the Auditor this ledger runs with:
	// Execute then refuses every request (ErrOrderToken), and
	// ExecuteOrdered runs one only with the Auditor's valid, unexpired
	// order token for it (package auditor).
	Auditor auth.Verifier
	// Now is the clock order tokens' deadlines are checked against; nil
	// means time.Now.
	Now func() time.Time
}

// Ledger runs contracts as strictly serializable transactions on a storage
// backend and keeps every asset as a hash chain of versions. It is safe for
// concurrent use.
type Ledger struct {
	b   storage.Backend
	ns  string
	cfg Config
	lim Limits

	// Identities and contracts never change once registered (registration
	// is IfNotExists), so positive lookups are cached for good.
	verifiers sync.Map // identityKey → auth.Verifier
	contracts sync.Map // contract id → Contract

	stores sync.Pool // spent *txStore, for reuse

	// gate bounds the executions running Starlark at once.
	gate *gate
}

type identityKey struct {
	entity  string
	version uint32
}

// Open attaches a ledger to its backend, creating its tables if needed.
func Open(ctx context.Context, cfg Config) (*Ledger, error) {
	if cfg.Backend == nil || cfg.Signer == nil || cfg.ProofVerifier == nil {
		return nil, errors.New("ledger: Config needs Backend, Signer and ProofVerifier")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	lim := cfg.Limits.withDefaults()
	if err := lim.check(); err != nil {
		return nil, err
	}
	if err := ensureSchema(ctx, cfg.Backend, cfg.Namespace); err != nil {
		return nil, err
	}
	return &Ledger{b: cfg.Backend, ns: cfg.Namespace, cfg: cfg, lim: lim, gate: newGate(gateSlots(lim))}, nil
}

// ---- identities ----

// RegisterCertificate registers an ECDSA P-256 certificate (PEM) as the key
// of (entity, keyVersion). The caller is trusted: the server only lets an
// administrator call it.
func (l *Ledger) RegisterCertificate(ctx context.Context, entity string, keyVersion uint32, certPEM []byte) error {
	if err := checkIdentity(entity, keyVersion); err != nil {
		return err
	}
	if _, err := auth.ParseCertificatePEM(certPEM); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return l.putIdentity(ctx, entity, keyVersion, auth.SchemeECDSA, certPEM, func(stored []byte) bool { return bytes.Equal(stored, certPEM) })
}

// RegisterSecret registers an HMAC-SHA256 secret as the key of (entity,
// keyVersion); it is stored sealed under the server key.
func (l *Ledger) RegisterSecret(ctx context.Context, entity string, keyVersion uint32, secret []byte) error {
	if err := checkIdentity(entity, keyVersion); err != nil {
		return err
	}
	if l.cfg.Secrets == nil {
		return fmt.Errorf("%w: this ledger has no server key for HMAC secrets", ErrRegistrationDisabled)
	}
	if _, err := auth.NewHMACVerifier(secret); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	sealed, err := l.cfg.Secrets.Seal(secret, secretAD(entity, keyVersion))
	if err != nil {
		return err
	}
	ad := secretAD(entity, keyVersion)
	return l.putIdentity(ctx, entity, keyVersion, auth.SchemeHMAC, sealed, func(stored []byte) bool {
		got, err := l.cfg.Secrets.Open(stored, ad)
		return err == nil && hmac.Equal(got, secret)
	})
}

// secretAD binds a sealed secret to its identity, so a sealed secret moved
// to another row does not open.
func secretAD(entity string, keyVersion uint32) []byte {
	return []byte("kiroku/secret/" + entity + "/" + strconv.FormatUint(uint64(keyVersion), 10))
}

// putIdentity stores (entity, keyVersion) unless it exists. Repeating the
// same registration succeeds, so a caller can retry one whose reply was
// lost: same(stored material) says whether the stored identity is this one
// (a sealed secret differs byte for byte from a second sealing of it).
func (l *Ledger) putIdentity(ctx context.Context, entity string, keyVersion uint32, scheme auth.Scheme, material []byte,
	same func(stored []byte) bool) error {
	part := storage.Values{"entity": storage.Text(entity)}
	clust := storage.Values{"key_version": storage.BigInt(int64(keyVersion))}
	err := l.b.Put(ctx, &storage.Put{Namespace: l.ns, Table: tIdentities, Partition: part, Clustering: clust,
		Values:    storage.Values{"scheme": storage.BigInt(int64(scheme)), "material": storage.Blob(material)},
		Condition: storage.IfNotExists()})
	if !errors.Is(err, storage.ErrConditionNotMet) {
		return err
	}
	row, ok, err := l.b.Get(ctx, &storage.Get{Namespace: l.ns, Table: tIdentities, Partition: part, Clustering: clust})
	if err != nil {
		return err
	}
	if ok {
		rr := &rowReader{what: fmt.Sprintf("identity %s version %d", entity, keyVersion), r: row}
		stored, storedScheme := rr.blob("material"), auth.Scheme(rr.bigint("scheme"))
		if rr.err != nil {
			return rr.err
		}
		if storedScheme == scheme && same(stored) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s version %d", ErrIdentityExists, entity, keyVersion)
}

// verifier returns the verifier of (entity, keyVersion).
func (l *Ledger) verifier(ctx context.Context, entity string, keyVersion uint32) (auth.Verifier, error) {
	k := identityKey{entity, keyVersion}
	if v, ok := l.verifiers.Load(k); ok {
		return v.(auth.Verifier), nil
	}
	row, ok, err := l.b.Get(ctx, &storage.Get{Namespace: l.ns, Table: tIdentities,
		Partition:  storage.Values{"entity": storage.Text(entity)},
		Clustering: storage.Values{"key_version": storage.BigInt(int64(keyVersion))}})
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s version %d", ErrUnknownEntity, entity, keyVersion)
	}
	rr := &rowReader{what: fmt.Sprintf("identity %s version %d", entity, keyVersion), r: row}
	material, scheme := rr.blob("material"), auth.Scheme(rr.bigint("scheme"))
	if rr.err != nil {
		return nil, rr.err
	}
	var v auth.Verifier
	switch scheme {
	case auth.SchemeECDSA:
		cert, perr := auth.ParseCertificatePEM(material)
		if perr != nil {
			return nil, fmt.Errorf("ledger: stored certificate of %s version %d: %w", entity, keyVersion, perr)
		}
		v, err = auth.NewECDSAVerifier(cert.PublicKey.(*ecdsa.PublicKey))
	case auth.SchemeHMAC:
		if l.cfg.Secrets == nil {
			return nil, fmt.Errorf("%w: %s version %d has an HMAC secret and this ledger has no server key", ErrUnknownEntity, entity, keyVersion)
		}
		secret, oerr := l.cfg.Secrets.Open(material, secretAD(entity, keyVersion))
		if oerr != nil {
			return nil, fmt.Errorf("ledger: stored secret of %s version %d: %w", entity, keyVersion, oerr)
		}
		v, err = auth.NewHMACVerifier(secret)
	default:
		return nil, fmt.Errorf("ledger: identity %s version %d has unknown scheme %d", entity, keyVersion, scheme)
	}
	if err != nil {
		return nil, err
	}
	l.verifiers.Store(k, v)
	return v, nil
}

// ---- contracts ----

// RegisterContract verifies the registration's signature, compiles the
// source and stores it under its id. Ids are immutable: registering an id
// again with other source, or from another identity, fails with
// ErrContractExists; repeating the same registration succeeds.
func (l *Ledger) RegisterContract(ctx context.Context, reg *ContractRegistration) error {
	if err := checkID("contract id", reg.ID); err != nil {
		return err
	}
	if len(reg.ID) >= len(BuiltinPrefix) && reg.ID[:len(BuiltinPrefix)] == BuiltinPrefix {
		return fmt.Errorf("%w: contract ids starting with %q are reserved for built-in contracts", ErrBadRequest, BuiltinPrefix)
	}
	if err := checkIdentity(reg.Entity, reg.KeyVersion); err != nil {
		return err
	}
	if err := checkSignatureLen(reg.Signature); err != nil {
		return err
	}
	if len(reg.Source) > l.lim.MaxSourceBytes {
		return fmt.Errorf("%w: source is %d bytes, limit %d", ErrTooLarge, len(reg.Source), l.lim.MaxSourceBytes)
	}
	v, err := l.verifier(ctx, reg.Entity, reg.KeyVersion)
	if err != nil {
		return err
	}
	if err := Verify(v, reg, reg.Signature); err != nil {
		return err
	}
	// Compiling runs the contract's top level: it takes a slot of the
	// gate like an execution.
	leave, err := l.gate.enter(ctx, l.lim.MaxExecutionTime)
	if err != nil {
		return err
	}
	_, err = compileStarlark(ctx, reg.ID, reg.Source, l.lim)
	leave()
	if err != nil {
		return err
	}
	part := storage.Values{"bucket": storage.Text(contractBucket)}
	clust := storage.Values{"id": storage.Text(reg.ID)}
	err = l.b.Put(ctx, &storage.Put{Namespace: l.ns, Table: tContracts, Partition: part, Clustering: clust,
		Values: storage.Values{"source": storage.Blob(reg.Source), "entity": storage.Text(reg.Entity),
			"key_version": storage.BigInt(int64(reg.KeyVersion)), "signature": storage.Blob(reg.Signature)},
		Condition: storage.IfNotExists()})
	if !errors.Is(err, storage.ErrConditionNotMet) {
		return err
	}
	// The same source from the same registrant is this registration
	// repeated (a retry whose first reply was lost): it keeps the first
	// signature, which states the same thing.
	row, ok, err := l.b.Get(ctx, &storage.Get{Namespace: l.ns, Table: tContracts, Partition: part, Clustering: clust})
	if err != nil {
		return err
	}
	if ok {
		rr := &rowReader{what: "contract " + reg.ID, r: row}
		source, entity, kv := rr.blob("source"), rr.text("entity"), rr.bigint("key_version")
		if rr.err != nil {
			return rr.err
		}
		if bytes.Equal(source, reg.Source) && entity == reg.Entity && kv == int64(reg.KeyVersion) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s", ErrContractExists, reg.ID)
}

// ContractInfo describes a registered contract.
type ContractInfo struct {
	ID         string
	Builtin    bool   // compiled into the binary
	Entity     string // who registered it; "" for built-ins
	KeyVersion uint32
	Source     []byte // nil for built-ins
}

// ListContracts returns the built-in contracts and then the registered
// ones, each group sorted by id.
func (l *Ledger) ListContracts(ctx context.Context) ([]ContractInfo, error) {
	var out []ContractInfo
	for _, id := range slices.Sorted(maps.Keys(Builtins)) {
		out = append(out, ContractInfo{ID: id, Builtin: true})
	}
	rows, err := l.b.Scan(ctx, &storage.Scan{Namespace: l.ns, Table: tContracts,
		Partition: storage.Values{"bucket": storage.Text(contractBucket)}})
	if err != nil {
		return nil, err
	}
	all, err := storage.CollectRows(rows)
	if err != nil {
		return nil, err
	}
	for _, r := range all {
		rr := &rowReader{what: "contract", r: r}
		out = append(out, ContractInfo{ID: rr.text("id"), Entity: rr.text("entity"), KeyVersion: uint32(rr.bigint("key_version")),
			Source: rr.blob("source")})
		if rr.err != nil {
			return nil, rr.err
		}
	}
	return out, nil
}

// contract returns the compiled contract id.
func (l *Ledger) contract(ctx context.Context, id string) (Contract, error) {
	if c, ok := Builtins[id]; ok {
		return c, nil
	}
	if c, ok := l.contracts.Load(id); ok {
		return c.(Contract), nil
	}
	if err := checkID("contract id", id); err != nil {
		return nil, err
	}
	row, ok, err := l.b.Get(ctx, &storage.Get{Namespace: l.ns, Table: tContracts,
		Partition:  storage.Values{"bucket": storage.Text(contractBucket)},
		Clustering: storage.Values{"id": storage.Text(id)}, Projection: []string{"source"}})
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownContract, id)
	}
	rr := &rowReader{what: "contract " + id, r: row}
	source := rr.blob("source")
	if rr.err != nil {
		return nil, rr.err
	}
	// Compiled only: its top level runs at the first call, inside the
	// execution's gate slot (prepareStarlark), so a stored contract loaded
	// for the first time is bounded as a registration's is.
	c, err := prepareStarlark(id, source)
	if err != nil {
		return nil, fmt.Errorf("ledger: stored contract %s: %w", id, err)
	}
	l.contracts.Store(id, c)
	return c, nil
}

// ---- transaction states ----

// TxStatus is the outcome recorded for a nonce (proof.TxStatus).
type TxStatus = proof.TxStatus

const (
	TxCommitted = proof.TxCommitted
	TxAborted   = proof.TxAborted
	TxUnknown   = proof.TxUnknown // nothing recorded (never seen, rejected before execution, or still running)
)

// TxState is what the ledger recorded for a nonce (proof.TxState).
type TxState = proof.TxState

// TxState returns the recorded state of nonce; TxUnknown if there is none.
func (l *Ledger) TxState(ctx context.Context, nonce string) (*TxState, error) {
	if err := checkID("nonce", nonce); err != nil {
		return nil, err
	}
	row, ok, err := l.b.Get(ctx, l.txStateGet(nonce))
	if err != nil {
		return nil, err
	}
	if !ok {
		return &TxState{Nonce: nonce, Status: TxUnknown}, nil
	}
	rr := &rowReader{what: "tx state " + nonce, r: row}
	st := &TxState{Nonce: nonce, Status: TxStatus(rr.text("state")), Kind: rr.text("kind"), Reason: rr.text("reason"),
		Contract: rr.text("contract"), Result: []byte(rr.text("result")), Signature: rr.blob("signature"),
		Writes: rr.ages("writes"), Input: rr.ages("input")}
	if rr.err != nil {
		return nil, rr.err
	}
	return st, nil
}

func (l *Ledger) txStateGet(nonce string) *storage.Get {
	return &storage.Get{Namespace: l.ns, Table: tTxStates, Partition: storage.Values{"nonce": storage.Text(nonce)}}
}
