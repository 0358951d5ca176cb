package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
	"github.com/kiroku-db/kiroku/validator"
)

// validatorFlags select and open the Validator database.
type validatorFlags struct {
	db, dir, dsn, contacts, namespace string
	counters, scanEvery               int
	txTimeout                         time.Duration
}

func (vf *validatorFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&vf.db, "validator-db", "engine", "the Validator database: "+backends.Help())
	f.StringVar(&vf.dir, "validator-dir", "", "data directory of an engine Validator database")
	f.StringVar(&vf.dsn, "validator-dsn", "", "PostgreSQL DSN of a postgres Validator database")
	f.StringVar(&vf.contacts, "validator-cassandra", "", "Cassandra contact points HOST:PORT,... of a cassandra Validator database")
	f.StringVar(&vf.namespace, "validator-namespace", validator.DefaultNamespace, "namespace of the Validator's tables")
	f.IntVar(&vf.counters, "clock-counters", 0, "K, the clock table's counters (0: 1); on an engine Validator database no clock scans them (one process owns it)")
	f.IntVar(&vf.scanEvery, "clock-scan-every", 0, "N: begin clocks scan the clock table every Nth time (0 or 1: always); on PostgreSQL only those not claimed in the request commit scan at all, and on an engine Validator database none does")
	f.DurationVar(&vf.txTimeout, "tx-timeout", 30*time.Second, "the ledger's transaction timeout, for in-doubt recovery")
}

// openDB opens the Validator database.
func (vf *validatorFlags) openDB(ctx context.Context) (storage.Backend, error) {
	switch {
	case vf.db == "engine" && vf.dir == "":
		return nil, errors.New("--validator-db=engine needs --validator-dir")
	case vf.db == "postgres" && vf.dsn == "":
		return nil, errors.New("--validator-db=postgres needs --validator-dsn")
	case vf.db == "cassandra" && vf.contacts == "":
		return nil, errors.New("--validator-db=cassandra needs --validator-cassandra")
	}
	db, err := backends.Open(ctx, vf.db, backends.Config{Dir: vf.dir, DSN: vf.dsn, Contacts: vf.contacts})
	if err != nil {
		return nil, fmt.Errorf("--validator-db: %w", err)
	}
	return db, nil
}

// open opens the Validator over c; proofKey nil pins the ledger's ECDSA
// key.
func (vf *validatorFlags) open(ctx context.Context, db storage.Backend, c *client.Client, proofKey auth.Verifier) (*validator.Validator, error) {
	return validator.Open(ctx, validator.Config{DB: db, Namespace: vf.namespace, Client: c, TxTimeout: vf.txTimeout, LedgerKey: proofKey,
		Clock: validator.ClockConfig{Counters: vf.counters, ScanEvery: vf.scanEvery}})
}

func validateCmd() *cobra.Command {
	var (
		cf    clientFlags
		vf    validatorFlags
		scope validator.Scope
	)
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Validator: validate what was logged and report Byzantine faults of the ledger",
		Long: `Runs the Validator's validation phase (seed 000, Algorithm 2) over every transaction logged in the
Validator database since the last run: resolves in-doubt transactions with the ledger, checks
receipt and proof signatures, re-executes each contract on the Validator's own states, checks the
multi-version serialization graph for cycles and the clocks for stale reads. It then reports the
violations in scope — a key (--key, with --age for one version), a key range (--key-start,
--key-end), a transaction (--tx), or, by default, everything this run validated — and, with
--cross-check (on by default), compares the ledger's history of those keys with the log.
By default only the assets written by transactions new to this run are cross-checked: a
history altered after an earlier run validated it is caught with --all, which re-reads the
history of every asset ever logged. The report says which was done.
The exit status is non-zero on any violation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := cf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			db, err := vf.openDB(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			v, err := vf.open(ctx, db, c, nil)
			if err != nil {
				return err
			}
			rep, err := v.Validate(ctx, scope)
			if rep == nil {
				return err
			}
			// A run that failed after storing what it found still shows it.
			w := cmd.OutOrStdout()
			if cf.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				rep.Print(w)
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return fmt.Errorf("validate: %d violations", len(rep.Violations))
			}
			return nil
		},
	}
	cf.add(cmd)
	vf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&scope.Key, "key", "", "report violations on this asset")
	f.Int64Var(&scope.Age, "age", -1, "with --key: only this version (-1: all)")
	f.StringVar(&scope.KeyStart, "key-start", "", "report violations on assets from this id")
	f.StringVar(&scope.KeyEnd, "key-end", "", "... up to (not including) this id")
	f.StringVar(&scope.Nonce, "tx", "", "report violations involving this transaction (nonce)")
	f.BoolVar(&scope.CrossCheck, "cross-check", true, "compare the ledger's history of the keys in scope with the log")
	f.BoolVar(&scope.All, "all", false, "cross-check the ledger's current history of every asset ever logged, not only those written by transactions new to this run: catches a history altered since an earlier run; costs one read of each logged asset's whole history")
	return cmd
}
