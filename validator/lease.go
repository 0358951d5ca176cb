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

// ErrLeaseLost means a validation lost its lease (another took it over, or
// it could not renew it before it expired) and stopped before persisting
// anything more.
var ErrLeaseLost = errors.New("validator: the validation lease was lost")

// DefaultLeaseTTL is Config.LeaseTTL's default.
const DefaultLeaseTTL = 2 * time.Minute

const leaseRow = "validation_lease"

// lease is the meta row's value. A renewal or a release is conditioned on
// the whole text its holder last wrote; the fence needs only the holder.
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
	until  int64  // its expiry, Unix microseconds
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
	l := lease{Holder: h.holder, Until: h.v.cfg.Now().Add(h.v.cfg.LeaseTTL).UnixMicro()}
	b, _ := json.Marshal(l)
	err := h.v.db.Put(ctx, &storage.Put{Namespace: h.v.ns, Table: tMeta, Partition: h.v.leaseKey(),
		Values: storage.Values{"value": storage.Text(string(b))}, Condition: cond})
	if err == nil {
		h.value, h.until = string(b), l.Until
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
		expired := h.v.cfg.Now().UnixMicro() >= h.until
		h.mu.Unlock()
		// Only a changed row means another holder; any other failure is
		// tried again at the next tick while the lease written last lasts.
		if err != nil && ctx.Err() == nil && (errors.Is(err, storage.ErrConditionNotMet) || expired) {
			h.cancel(fmt.Errorf("%w: %w", ErrLeaseLost, err))
			return
		}
	}
}

// fence fails the transaction tx unless the lease row still names h as its
// holder. Reading the row inside each persisting transaction makes the
// lease a fence, not only a lock: a holder that stalled past its expiry
// and was taken over commits nothing more, because the takeover's write
// and this read cannot both serialize first. A renewal changes only the
// expiry, so it never fails the fence.
func (h *heldLease) fence(ctx context.Context, tx storage.Txn) error {
	row, ok, err := tx.Get(ctx, &storage.Get{Namespace: h.v.ns, Table: tMeta, Partition: h.v.leaseKey()})
	if err != nil {
		return err
	}
	var cur lease
	if ok && !row["value"].IsNull() {
		if err := json.Unmarshal([]byte(row["value"].AsText()), &cur); err != nil {
			return fmt.Errorf("validator: the validation lease row holds %q: %w", row["value"].AsText(), err)
		}
	}
	if cur.Holder != h.holder {
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
