package validator

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// scopeKeys returns the asset ids a cross-check covers.
func (r *run) scopeKeys(s Scope) ([]string, error) {
	switch {
	case s.Key != "":
		return []string{s.Key}, nil
	case s.Nonce != "":
		t, err := r.v.loadTx(r.ctx, s.Nonce)
		if err != nil || t == nil {
			return nil, err
		}
		return slices.Sorted(maps.Keys(t.Receipt.Writes)), nil
	case s.KeyStart != "" || s.KeyEnd != "" || s.All:
		sc := &storage.Scan{Namespace: r.v.ns, Table: tKeys, Partition: storage.Values{"bucket": storage.Text(keysBucket)},
			Start: &storage.Bound{Key: storage.Values{"id": storage.Text(s.KeyStart)}, Inclusive: true}}
		if s.KeyEnd != "" {
			sc.End = &storage.Bound{Key: storage.Values{"id": storage.Text(s.KeyEnd)}, Inclusive: false}
		}
		all, err := r.v.scanRows(r.ctx, sc)
		if err != nil {
			return nil, err
		}
		out := make([]string, len(all))
		for i, row := range all {
			out[i] = row["id"].AsText()
		}
		return out, nil
	}
	keys := map[string]bool{}
	for _, t := range r.focus {
		for k := range t.Receipt.Writes {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys)), nil
}

// crossCheck compares the ledger's history of each key with the log: every
// validated committed write must be in the history at its age, with the
// output the Validator recomputed; every version in the history must have
// been written, once, by a logged committed transaction.
func (r *run) crossCheck(keys []string) error {
	txCache := map[string]*Tx{}
	logged := func(nonce string) (*Tx, error) {
		if t, ok := txCache[nonce]; ok {
			return t, nil
		}
		t, err := r.v.loadTx(r.ctx, nonce)
		txCache[nonce] = t
		return t, err
	}
	report := func(vl Violation) {
		r.rep.Violations = append(r.rep.Violations, vl)
	}
	for _, k := range keys {
		hist, err := r.history(k)
		if err != nil {
			return err
		}
		byAge := map[int64]*proof.Version{}
		ledgerAges := map[string][]int64{} // nonce → ages it holds in the history
		for _, lv := range hist {
			byAge[lv.Age] = lv
			ledgerAges[lv.Nonce] = append(ledgerAges[lv.Nonce], lv.Age)
		}
		rows, err := r.v.accesses(r.ctx, k, 0, 1<<62)
		if err != nil {
			return err
		}
		loggedAt := map[int64][]string{} // age → validated writers
		for _, row := range rows {
			if row["op"].AsText() == "w" {
				a := row["age"].AsBigInt()
				loggedAt[a] = append(loggedAt[a], row["nonce"].AsText())
			}
		}
		for _, a := range slices.Sorted(maps.Keys(loggedAt)) {
			for _, n := range loggedAt[a] {
				r.rep.CrossChecked++
				lv := byAge[a]
				switch {
				case lv != nil && lv.Nonce == n:
					s, ok, err := r.state(k, a)
					if err != nil {
						return err
					}
					if ok && s.nonce == n && (!bytes.Equal(lv.Output, s.output) || !bytes.Equal(lv.Hash, s.hash)) {
						report(Violation{Kind: KindIODivergence, Txs: []string{n}, Key: k, Age: a,
							Detail: fmt.Sprintf("the ledger stores %s for %s@%d; the validated state is %s", clip(lv.Output), k, a, clip(s.output))})
					}
				case len(ledgerAges[n]) > 0:
					report(Violation{Kind: KindReordered, Txs: []string{n}, Key: k, Age: a,
						Detail: fmt.Sprintf("%s wrote %s@%d, but the ledger's history has its version at age %v", n, k, a, ledgerAges[n])})
				default:
					detail := fmt.Sprintf("the ledger's history has no %s@%d", k, a)
					if lv != nil {
						detail = fmt.Sprintf("the ledger's history has %s@%d written by %s instead", k, a, lv.Nonce)
					}
					report(Violation{Kind: KindDropped, Txs: []string{n}, Key: k, Age: a, Detail: detail + "; the transaction that wrote it is gone"})
				}
			}
		}
		for _, lv := range hist {
			if slices.Contains(loggedAt[lv.Age], lv.Nonce) {
				continue
			}
			t, err := logged(lv.Nonce)
			if err != nil {
				return err
			}
			switch {
			case t != nil && !t.Validated:
				// Logged, not yet validated: a later run checks it.
			case t != nil && t.Status == StatusCommitted:
				if a, ok := t.Receipt.Writes[k]; ok && slices.Contains(ledgerAges[lv.Nonce], a) {
					report(Violation{Kind: KindReplay, Txs: []string{lv.Nonce}, Key: k, Age: lv.Age,
						Detail: fmt.Sprintf("%s committed once, writing %s@%d; the ledger's history holds another version under its nonce at age %d",
							lv.Nonce, k, a, lv.Age)})
				}
				// Otherwise the version moved: reported above as reordered.
			case t != nil:
				report(Violation{Kind: KindUnlogged, Txs: []string{lv.Nonce}, Key: k, Age: lv.Age,
					Detail: fmt.Sprintf("the ledger's history holds %s@%d from %s, which the Validator logged as aborted (%s)", k, lv.Age, lv.Nonce, t.Reason)})
			default:
				report(Violation{Kind: KindUnlogged, Txs: []string{lv.Nonce}, Key: k, Age: lv.Age,
					Detail: fmt.Sprintf("the ledger's history holds %s@%d from %s, which no Validator logged", k, lv.Age, lv.Nonce)})
			}
		}
	}
	return nil
}

// history fetches every version of id from the ledger, a page at a time.
func (r *run) history(id string) ([]*proof.Version, error) {
	var out []*proof.Version
	for start := int64(0); ; {
		page, err := r.v.c.History(r.ctx, id, proof.ScanRange{Start: start, End: -1, Ascending: true})
		if errors.Is(err, proof.ErrNotFound) {
			return out, nil // no version at all: every logged write is dropped
		}
		if err != nil {
			return nil, fmt.Errorf("validator: history of %s: %w", id, err)
		}
		out = append(out, page...)
		if len(page) == 0 {
			return out, nil
		}
		if last := page[len(page)-1].Age; last >= start {
			start = last + 1
		} else {
			return out, nil // a page that does not advance; what it holds is checked
		}
	}
}
