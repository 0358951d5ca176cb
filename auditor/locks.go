package auditor

import (
	"context"
	"slices"
	"sync"
	"time"
)

// lockTable orders conflicting requests: a request holds a shared lock on
// every asset it only reads and an exclusive lock on every asset it
// writes, from Ordering until its Validation (or its recovery) releases
// them. Requests that touch disjoint assets, or only read the same ones,
// hold their locks at once; conflicting ones queue, first come first
// served per asset. A request takes its locks one asset at a time in the
// assets' sorted order, so no two requests wait for each other in a
// cycle.
//
// Every holder has a lease. The table never frees a lock because its lease
// ran out — the request it orders may have committed on the ledger, and
// the next one must see its outcome — it reports the holder (expired), and
// recovery settles the request and then releases it.
type lockTable struct {
	mu      sync.Mutex
	assets  map[string]*assetLock
	holders map[string]*holder // nonce → its locks, once all are granted or while it waits
	now     func() time.Time
}

type assetLock struct {
	exclusive string          // the nonce holding it exclusively, or ""
	shared    map[string]bool // the nonces holding it shared
	queue     []*waiter
}

type waiter struct {
	nonce     string
	exclusive bool
	granted   chan struct{}
}

type holder struct {
	assets []string // sorted
	writes map[string]bool
	held   int // how many of assets are granted
	expiry time.Time
	ready  chan struct{} // closed once all are granted
}

func newLockTable(now func() time.Time) *lockTable {
	if now == nil {
		now = time.Now
	}
	return &lockTable{assets: map[string]*assetLock{}, holders: map[string]*holder{}, now: now}
}

// errLocked is returned by acquire for a nonce that already holds or
// waits for locks: a request is ordered once.
type errLocked struct{ nonce string }

func (e *errLocked) Error() string { return "auditor: request " + e.nonce + " is ordered already" }

// acquire takes the locks of request nonce — shared on reads, exclusive on
// writes (an asset in both is written) — waiting for conflicting holders
// in order, and sets its lease to end lease after the last lock is
// granted. If ctx ends first, the locks taken so far are released and
// ctx's error returned.
func (lt *lockTable) acquire(ctx context.Context, nonce string, reads, writes []string, lease time.Duration) error {
	h := &holder{writes: map[string]bool{}, ready: make(chan struct{})}
	for _, w := range writes {
		h.writes[w] = true
	}
	h.assets = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(reads), writes...))))
	lt.mu.Lock()
	if _, dup := lt.holders[nonce]; dup {
		lt.mu.Unlock()
		return &errLocked{nonce}
	}
	lt.holders[nonce] = h
	lt.mu.Unlock()
	for _, a := range h.assets {
		lt.mu.Lock()
		w := lt.request(nonce, a, h.writes[a])
		lt.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			lt.release(nonce)
			return ctx.Err()
		}
		lt.mu.Lock()
		h.held++
		lt.mu.Unlock()
	}
	lt.mu.Lock()
	h.expiry = lt.now().Add(lease)
	close(h.ready)
	lt.mu.Unlock()
	return nil
}

// request queues nonce for asset a and returns a channel closed when the
// lock is granted. Called with mu held.
func (lt *lockTable) request(nonce, a string, exclusive bool) chan struct{} {
	l := lt.assets[a]
	if l == nil {
		l = &assetLock{shared: map[string]bool{}}
		lt.assets[a] = l
	}
	w := &waiter{nonce: nonce, exclusive: exclusive, granted: make(chan struct{})}
	l.queue = append(l.queue, w)
	lt.grant(l)
	return w.granted
}

// grant hands the lock to the waiters at the head of a's queue that fit:
// one exclusive, or a run of shared ones. Called with mu held.
func (lt *lockTable) grant(l *assetLock) {
	for len(l.queue) > 0 {
		w := l.queue[0]
		switch {
		case l.exclusive != "":
			return
		case w.exclusive && len(l.shared) > 0:
			return
		case w.exclusive:
			l.exclusive = w.nonce
		default:
			l.shared[w.nonce] = true
		}
		l.queue = l.queue[1:]
		close(w.granted)
	}
}

// release frees every lock nonce holds or waits for. Releasing a nonce
// that holds none does nothing.
func (lt *lockTable) release(nonce string) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	h := lt.holders[nonce]
	if h == nil {
		return
	}
	delete(lt.holders, nonce)
	for _, a := range h.assets {
		l := lt.assets[a]
		if l == nil {
			continue
		}
		if l.exclusive == nonce {
			l.exclusive = ""
		}
		delete(l.shared, nonce)
		l.queue = slices.DeleteFunc(l.queue, func(w *waiter) bool { return w.nonce == nonce })
		lt.grant(l)
		if l.exclusive == "" && len(l.shared) == 0 && len(l.queue) == 0 {
			delete(lt.assets, a)
		}
	}
}

// holds reports whether nonce holds all its locks.
func (lt *lockTable) holds(nonce string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	h := lt.holders[nonce]
	return h != nil && h.held == len(h.assets)
}

// extend moves nonce's lease to end lease from now; false if it holds no
// locks.
func (lt *lockTable) extend(nonce string, lease time.Duration) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	h := lt.holders[nonce]
	if h == nil || h.held < len(h.assets) {
		return false
	}
	h.expiry = lt.now().Add(lease)
	return true
}

// expired returns the nonces holding all their locks whose lease has run
// out, sorted.
func (lt *lockTable) expired() []string {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	now := lt.now()
	var out []string
	for n, h := range lt.holders {
		if h.held == len(h.assets) && !h.expiry.IsZero() && now.After(h.expiry) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// size is the number of requests holding or waiting for locks.
func (lt *lockTable) size() int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return len(lt.holders)
}
