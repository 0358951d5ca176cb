package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/bench"
	"github.com/kiroku-db/kiroku/validator"
)

func benchValidateCmd() *cobra.Command {
	var (
		records, txs, threads int
		workload, authName    string
		vf                    validatorFlags
		asJSON                bool
	)
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Validator: validation throughput over a logged YCSB history",
		Long: `Starts a ledger server in this process, loads --records assets and runs --txs YCSB transactions
(--workload, --threads closed-loop clients) through a Validator, then validates the whole logged
history in one run and reports validated transactions per second, the MVSG it built and the time
per phase. The baseline, from the same run, is the rate at which the history was logged: a
Validator keeps up with its clients only if it validates faster than that.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			scheme, err := auth.ParseScheme(authName)
			if err != nil {
				return fmt.Errorf("--auth: %w", err)
			}
			c, proofKey, _, cleanup, err := benchLedgerClient(ctx, scheme, "", "", benchBackend{name: "engine"}, "", false, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer cleanup()
			v, closeV, err := benchValidator(ctx, &vf, c, proofKey)
			if err != nil {
				return err
			}
			defer closeV()
			errw := cmd.ErrOrStderr()
			// Threads and Duration are RunLedger's; RunLedgerCount takes
			// the thread count and the transaction count itself.
			cfg := bench.LedgerConfig{Workload: workload, Records: records, Payload: 100, Threads: []int{threads}, Duration: time.Second}
			if _, err := bench.LoadLedger(ctx, c, v, cfg, errw); err != nil {
				return err
			}
			logged, err := bench.RunLedgerCount(ctx, c, v, cfg, threads, int64(txs))
			if err != nil {
				return err
			}
			if logged.Errors > 0 {
				return fmt.Errorf("bench validate: %d of %d transactions failed while logging", logged.Errors, txs)
			}
			fmt.Fprintf(errw, "logged %d transactions at %.0f tx/s\n", logged.Txs, logged.TPS)
			rep, err := v.Validate(ctx, validator.Scope{})
			if err != nil {
				return err
			}
			if !rep.OK() {
				rep.Print(errw)
				return fmt.Errorf("bench validate: an honest history produced %d violations", len(rep.Violations))
			}
			s := rep.Seconds
			tps := float64(rep.Validated) / s.Total
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"workload": workload, "records": records, "threads": threads, "auth": authName,
					"validator_db": vf.db, "validated": rep.Validated, "tx_per_s": tps, "graph_nodes": rep.GraphNodes,
					"graph_edges": rep.GraphEdges, "seconds": s, "logged_tx_per_s": logged.TPS})
			}
			fmt.Fprintf(out, "validation of a %s history: %d transactions (%d threads, %d assets, auth %s, Validator database %s)\n",
				workload, rep.Validated, threads, records, authName, vf.db)
			fmt.Fprintf(out, "  validated %.0f tx/s (%.2f s); graph %d nodes, %d edges\n", tps, s.Total, rep.GraphNodes, rep.GraphEdges)
			fmt.Fprintf(out, "  phases: read log %.2fs, recover %.2fs, signatures %.2fs, re-execution %.2fs, graph %.2fs, record %.2fs\n",
				s.Load, s.Recover, s.Signatures, s.IO, s.Graph, s.Persist)
			fmt.Fprintf(out, "  baseline (same run): the history was logged at %.0f tx/s by %d threads; validation keeps up if it is faster\n",
				logged.TPS, threads)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&records, "records", 10_000, "assets to load")
	f.IntVar(&txs, "txs", 100_000, "transactions to log before validating")
	f.IntVar(&threads, "threads", 32, "client threads while logging")
	f.StringVar(&workload, "workload", "ycsb-f", "ycsb-c or ycsb-f")
	f.StringVar(&authName, "auth", "hmac", "hmac or ecdsa, for requests and proofs")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	vf.add(cmd)
	return cmd
}
