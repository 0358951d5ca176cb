package validator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// ErrValidationRunning is returned by Validate while another validation
// holds the Validator database's lease: validations of one database run
// one at a time, whichever processes start them.
var ErrValidationRunning = errors.New("validator: another validation holds this Validator database")

// ErrLeaseLost means a validation could not renew its lease (another took
// it over after it expired) and stopped before persisting anything more.
var ErrLeaseLost = errors.New("validator: the validation lease was lost")

// DefaultLeaseTTL is Config.LeaseTTL's default.
const DefaultLeaseTTL = 2 * time.Minute

const leaseRow = "validation_lease"

// lease is the meta row's value. Its text is compared whole, so a renewal
// or a release succeeds only from the exact value its holder wrote.
type lease struct {
	Holder string `json:"holder"`
	Until  int64  `json:"until_unix_micros"`
}

// heldLease is a lease this process holds until release.
type heldLease struct {
	v      *Validator
	holder string
	mu     sync.Mutex
	value  string // the text last written
	stop   chan struct{}
	done   chan struct{}
	cancel context.CancelCauseFunc
}

func (v *Validator) leaseKey() storage.Values {
	return storage.Values{"name": storage.Text(leaseRow)}
}

// acquireLease takes the validation lease, or returns ErrValidationRunning
// naming its holder. The returned context is cancelled with ErrLeaseLost
// if a renewal fails.
func (v *Validator) acquireLease(ctx context.Context) (*heldLease, context.Context, error) {
	id := make([]byte, 8)
	rand.Read(id)
	h := &heldLease{v: v, holder: hex.EncodeToString(id), stop: make(chan struct{}), done: make(chan struct{})}
	for {
		row, ok, err := v.db.Get(ctx, &storage.Get{Namespace: v.ns, Table: tMeta, Partition: v.leaseKey()})
		if err != nil {
			return nil, nil, fmt.Errorf("validator: reading the validation lease: %w", err)
		}
		cond := storage.IfNotExists()
		if ok {
			old := row["value"]
			var cur lease
			if err := json.Unmarshal([]byte(old.AsText()), &cur); err != nil {
				return nil, nil, fmt.Errorf("validator: the validation lease row holds %q: %w", old.AsText(), err)
			}
			if now := v.cfg.Now(); now.UnixMicro() < cur.Until {
				return nil, nil, fmt.Errorf("%w: %s until %s", ErrValidationRunning, cur.Holder,
					time.UnixMicro(cur.Until).UTC().Format(time.RFC3339))
			}
			cond = storage.If(storage.Eq("value", old))
		}
		err = h.write(ctx, cond)
		if errors.Is(err, storage.ErrConditionNotMet) {
			continue // another took or renewed it meanwhile: look again
		}
		if err != nil {
			return nil, nil, fmt.Errorf("validator: taking the validation lease: %w", err)
		}
		break
	}
	rctx, cancel := context.WithCancelCause(ctx)
	h.cancel = cancel
	go h.renew(rctx)
	return h, rctx, nil
}

// write puts a fresh lease of h under cond.
func (h *heldLease) write(ctx context.Context, cond *storage.Condition) error {
	b, _ := json.Marshal(lease{Holder: h.holder, Until: h.v.cfg.Now().Add(h.v.cfg.LeaseTTL).UnixMicro()})
	err := h.v.db.Put(ctx, &storage.Put{Namespace: h.v.ns, Table: tMeta, Partition: h.v.leaseKey(),
		Values: storage.Values{"value": storage.Text(string(b))}, Condition: cond})
	if err == nil {
		h.value = string(b)
	}
	return err
}

func (h *heldLease) renew(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.v.cfg.LeaseTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		err := h.write(ctx, storage.If(storage.Eq("value", storage.Text(h.value))))
		h.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			h.cancel(fmt.Errorf("%w: %w", ErrLeaseLost, err))
			return
		}
	}
}

// check fails if the lease was lost; Validate calls it before persisting.
func (h *heldLease) check(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.write(ctx, storage.If(storage.Eq("value", storage.Text(h.value)))); err != nil {
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return nil
}

// fence fails the transaction tx unless the lease row still holds the
// value h last wrote. Reading the row inside each persisting transaction
// makes the lease a fence, not only a lock: a holder that stalled past its
// expiry after check, and was taken over, commits nothing more, because
// the takeover's write and this read cannot both serialize first.
func (h *heldLease) fence(ctx context.Context, tx storage.Txn) error {
	h.mu.Lock()
	want := h.value
	h.mu.Unlock()
	row, ok, err := tx.Get(ctx, &storage.Get{Namespace: h.v.ns, Table: tMeta, Partition: h.v.leaseKey()})
	if err != nil {
		return err
	}
	if !ok || row["value"].IsNull() || row["value"].AsText() != want {
		return fmt.Errorf("%w: another validation took it over", ErrLeaseLost)
	}
	return nil
}

// release stops renewing and deletes the lease if it is still h's. ctx is
// the context acquireLease returned; it is cancelled.
func (h *heldLease) release(ctx context.Context) error {
	close(h.stop)
	<-h.done
	defer h.cancel(nil)
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.v.db.Delete(context.WithoutCancel(ctx), &storage.Delete{Namespace: h.v.ns, Table: tMeta, Partition: h.v.leaseKey(),
		Condition: storage.If(storage.Eq("value", storage.Text(h.value)))})
	if err != nil && !errors.Is(err, storage.ErrConditionNotMet) {
		return fmt.Errorf("validator: releasing the validation lease: %w", err)
	}
	return nil
}
