package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
)

// clientFlags are shared by the commands that talk to a server.
type clientFlags struct {
	config string
	server string
	asJSON bool
	// The mode, and what it needs; each overrides the config's.
	mode, validator, auditor, auditorKey string
}

func (cf *clientFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&cf.config, "config", "", "client config file (JSON); default: KIROKU_* environment variables")
	f.StringVar(&cf.server, "server", "", "server address (overrides the config)")
	f.BoolVar(&cf.asJSON, "json", false, "print JSON")
	f.StringVar(&cf.mode, "mode", "", "direct, validator (a Validator logs each request first; see --validator) or auditor (through the Auditor at --auditor); overrides the config's mode")
	f.StringVar(&cf.validator, "validator", "", "the Validator database for --mode validator: engine:DIR, postgres:DSN or cassandra:HOST:PORT,...")
	f.StringVar(&cf.auditor, "auditor", "", "the Auditor's address for --mode auditor")
	f.StringVar(&cf.auditorKey, "auditor-key", "", "the Auditor's key for --mode auditor: its fingerprint, or a PEM file")
}

func (cf *clientFlags) dial() (*client.Client, error) {
	var cfg client.Config
	var err error
	if cf.config != "" {
		cfg, err = client.LoadConfig(cf.config)
	} else {
		cfg, err = client.ConfigFromEnv()
	}
	if err != nil {
		return nil, err
	}
	if cf.server != "" {
		cfg.Server = cf.server
	}
	for _, o := range []struct{ flag, to *string }{{&cf.mode, &cfg.Mode}, {&cf.validator, &cfg.Validator}, {&cf.auditor, &cfg.Auditor}} {
		if *o.flag != "" {
			*o.to = *o.flag
		}
	}
	if cf.auditorKey != "" {
		cfg.AuditorKey = cf.auditorKey
		if b, err := os.ReadFile(cf.auditorKey); err == nil {
			cfg.AuditorKey = string(b)
		}
	}
	return client.Dial(cfg)
}

// clientCmd builds a command that dials, runs f and prints its value: as
// JSON with --json, else with human.
func clientCmd(use, short string, args cobra.PositionalArgs, setup func(*cobra.Command),
	f func(ctx context.Context, c *client.Client, args []string) (any, error), human func(w io.Writer, v any)) *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: use, Short: short, Args: args,
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := cf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			v, err := f(cmd.Context(), c, a)
			var failed *validationFailed
			if err != nil && !errors.As(err, &failed) {
				return err
			}
			// A validation that found a fault prints its report and then
			// fails, so the exit status is non-zero.
			w := cmd.OutOrStdout()
			if cf.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(v); jerr != nil {
					return jerr
				}
			} else if failed == nil {
				human(w, v)
			}
			return err
		}}
	cf.add(cmd)
	if setup != nil {
		setup(cmd)
	}
	return cmd
}

func clientCmds() []*cobra.Command {
	var (
		contractID, sourceFile, argument, nonce string
		start, end                              int64
		limit                                   int
		desc                                    bool
	)
	ok := func(w io.Writer, v any) { fmt.Fprintln(w, v.(map[string]string)["status"]) }
	return []*cobra.Command{
		clientCmd("register-cert", "Enrol the configured certificate (needs the admin token)", cobra.NoArgs, nil,
			func(ctx context.Context, c *client.Client, _ []string) (any, error) {
				e, v := c.Entity()
				return map[string]string{"status": fmt.Sprintf("registered certificate of %s version %d", e, v)}, c.RegisterCertificate(ctx)
			}, ok),
		clientCmd("register-secret", "Enrol the configured HMAC secret (needs the admin token)", cobra.NoArgs, nil,
			func(ctx context.Context, c *client.Client, _ []string) (any, error) {
				e, v := c.Entity()
				return map[string]string{"status": fmt.Sprintf("registered secret of %s version %d", e, v)}, c.RegisterSecret(ctx)
			}, ok),
		clientCmd("register-contract", "Register a Starlark contract, signed", cobra.NoArgs,
			func(cmd *cobra.Command) {
				cmd.Flags().StringVar(&contractID, "contract-id", "", "the contract's id")
				cmd.Flags().StringVar(&sourceFile, "contract-file", "", "the Starlark source file")
				_ = cmd.MarkFlagRequired("contract-id")
				_ = cmd.MarkFlagRequired("contract-file")
			},
			func(ctx context.Context, c *client.Client, _ []string) (any, error) {
				src, err := os.ReadFile(sourceFile)
				if err != nil {
					return nil, err
				}
				return map[string]string{"status": "registered contract " + contractID}, c.RegisterContract(ctx, contractID, src)
			}, ok),
		clientCmd("list-contracts", "List the built-in and registered contracts", cobra.NoArgs, nil,
			func(ctx context.Context, c *client.Client, _ []string) (any, error) {
				cs, err := c.ListContracts(ctx)
				out := []map[string]any{}
				for _, x := range cs {
					out = append(out, map[string]any{"contract_id": x.ContractId, "builtin": x.Builtin, "entity": x.Entity, "key_version": x.KeyVersion})
				}
				return out, err
			},
			func(w io.Writer, v any) {
				for _, x := range v.([]map[string]any) {
					by := "built-in"
					if !x["builtin"].(bool) {
						by = fmt.Sprintf("registered by %s (key version %d)", x["entity"], x["key_version"])
					}
					fmt.Fprintf(w, "%-24s %s\n", x["contract_id"], by)
				}
			}),
		clientCmd("execute-contract", "Execute a contract with a JSON argument", cobra.NoArgs,
			func(cmd *cobra.Command) {
				cmd.Flags().StringVar(&contractID, "contract-id", "", "the contract to run")
				cmd.Flags().StringVar(&argument, "contract-argument", "{}", "the JSON argument")
				cmd.Flags().StringVar(&nonce, "nonce", "", "the nonce (default: a new UUID)")
				_ = cmd.MarkFlagRequired("contract-id")
			},
			func(ctx context.Context, c *client.Client, _ []string) (any, error) {
				if nonce == "" {
					nonce = client.NewNonce()
				}
				r, err := c.SignRequest(&ledger.Request{Nonce: nonce, ContractID: contractID, Argument: []byte(argument)})
				if err != nil {
					return nil, err
				}
				res, err := executeInMode(ctx, c, r)
				if err != nil {
					return nil, err
				}
				return resultJSON(res), nil
			}, printResult),
		clientCmd("get-asset ID", "Show an asset's versions with their proofs", cobra.ExactArgs(1),
			func(cmd *cobra.Command) {
				cmd.Flags().Int64Var(&start, "start-age", 0, "first age")
				cmd.Flags().Int64Var(&end, "end-age", -1, "last age (-1: the latest)")
				cmd.Flags().IntVar(&limit, "limit", 0, "at most this many versions (0: the server's cap)")
				cmd.Flags().BoolVar(&desc, "desc", false, "newest first")
			},
			func(ctx context.Context, c *client.Client, a []string) (any, error) {
				vs, err := c.History(ctx, a[0], ledger.ScanRange{Start: start, End: end, Ascending: !desc, Limit: limit})
				out := []VersionJSON{}
				for _, v := range vs {
					out = append(out, versionJSON(v))
				}
				return out, err
			}, printVersions),
		clientCmd("get-proof ID AGE", "Show the stored proof of one asset version", cobra.ExactArgs(2), nil,
			func(ctx context.Context, c *client.Client, a []string) (any, error) {
				age, err := strconv.ParseInt(a[1], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("age: %w", err)
				}
				p, err := c.Proof(ctx, a[0], age)
				if err != nil {
					return nil, err
				}
				return proofJSON(p), nil
			},
			func(w io.Writer, v any) { printProof(w, v.(ProofJSON)) }),
		clientCmd("get-tx-state NONCE", "Show the recorded state of a transaction", cobra.ExactArgs(1), nil,
			func(ctx context.Context, c *client.Client, a []string) (any, error) {
				return c.TxState(ctx, a[0])
			},
			func(w io.Writer, v any) {
				st := v.(*ledger.TxState)
				fmt.Fprintf(w, "%s", st.Status)
				if st.Reason != "" {
					fmt.Fprintf(w, ": %s", st.Reason)
				}
				fmt.Fprintln(w)
				for _, id := range slices.Sorted(maps.Keys(st.Input)) {
					fmt.Fprintf(w, "  read %s age %d\n", id, st.Input[id])
				}
				for _, id := range slices.Sorted(maps.Keys(st.Writes)) {
					fmt.Fprintf(w, "  wrote %s age %d\n", id, st.Writes[id])
				}
			}),
		clientCmd("validate-ledger ID", "Validate an asset's chain: signatures, hashes, links, nonces, re-execution", cobra.ExactArgs(1),
			func(cmd *cobra.Command) {
				cmd.Flags().Int64Var(&start, "start-age", 0, "first age")
				cmd.Flags().Int64Var(&end, "end-age", -1, "last age (-1: the latest)")
			},
			func(ctx context.Context, c *client.Client, a []string) (any, error) {
				v, err := c.ValidateLedger(ctx, a[0], start, end)
				if err != nil {
					return nil, err
				}
				if !v.Ok {
					return v, &validationFailed{v}
				}
				return v, nil
			}, printValidation),
		clientCmd("ledger-key", "Show the ledger's proof key", cobra.NoArgs, nil,
			func(ctx context.Context, c *client.Client, _ []string) (any, error) { return c.LedgerKey(ctx) },
			func(w io.Writer, v any) {
				k := v.(*api.LedgerKey)
				fmt.Fprintf(w, "scheme %s, fingerprint %s\n%s", k.Scheme, k.Fingerprint, k.PublicKeyPem)
			}),
	}
}

// validationFailed makes validate-ledger exit non-zero on a fault.
type validationFailed struct{ v *api.ValidateLedgerReply }

func (e *validationFailed) Error() string {
	return fmt.Sprintf("asset %s version %d fails %s: %s", e.v.Id, e.v.FaultAge, e.v.FaultCheck, e.v.FaultDetail)
}

func printValidation(w io.Writer, v any) {
	r := v.(*api.ValidateLedgerReply)
	fmt.Fprintf(w, "asset %s, ages %d–%d: %d versions valid\n", r.Id, r.StartAge, r.EndAge, r.Checked)
}

// JSON shapes of the CLI's output.
type (
	ProofJSON struct {
		ID        string           `json:"id"`
		Age       int64            `json:"age"`
		Nonce     string           `json:"nonce"`
		Input     map[string]int64 `json:"input"`
		Hash      string           `json:"hash"`
		PrevHash  string           `json:"prev_hash"`
		Signature string           `json:"ledger_signature"`
	}
	ResultJSON struct {
		Nonce  string          `json:"nonce"`
		Result json.RawMessage `json:"result"`
		Proofs []ProofJSON     `json:"proofs"`
	}
	VersionJSON struct {
		ProofJSON
		Output   json.RawMessage `json:"output"`
		Contract string          `json:"contract_id"`
		Argument string          `json:"argument"`
		Entity   string          `json:"entity"`
	}
)

func proofJSON(p *ledger.Proof) ProofJSON {
	return ProofJSON{ID: p.ID, Age: p.Age, Nonce: p.Nonce, Input: p.Input, Hash: hex.EncodeToString(p.Hash),
		PrevHash: hex.EncodeToString(p.PrevHash), Signature: hex.EncodeToString(p.Signature)}
}

func resultJSON(r *ledger.Result) ResultJSON {
	out := ResultJSON{Nonce: r.Nonce, Result: r.Result, Proofs: []ProofJSON{}}
	for i := range r.Proofs {
		out.Proofs = append(out.Proofs, proofJSON(&r.Proofs[i]))
	}
	return out
}

func versionJSON(v *ledger.Version) VersionJSON {
	p := v.Proof()
	return VersionJSON{ProofJSON: proofJSON(&p), Output: v.Output, Contract: v.Contract, Argument: string(v.Argument), Entity: v.Entity}
}

func short(h string) string {
	if len(h) > 16 {
		return h[:16] + "…"
	}
	return h
}

func printProof(w io.Writer, p ProofJSON) {
	input, _ := json.Marshal(p.Input) // map[string]int64 always marshals
	prev := short(p.PrevHash)
	if prev == "" {
		prev = "(none)"
	}
	fmt.Fprintf(w, "  proof %s@%d nonce %s input %s\n    hash %s prev %s ledger sig %s\n", p.ID, p.Age, p.Nonce, input,
		short(p.Hash), prev, short(p.Signature))
}

func printResult(w io.Writer, v any) {
	r := v.(ResultJSON)
	fmt.Fprintf(w, "committed %s: %s\n", r.Nonce, r.Result)
	for _, p := range r.Proofs {
		printProof(w, p)
	}
}

func printVersions(w io.Writer, v any) {
	for _, x := range v.([]VersionJSON) {
		fmt.Fprintf(w, "%s@%d  %s  (contract %s, by %s)\n", x.ID, x.Age, x.Output, x.Contract, x.Entity)
		printProof(w, x.ProofJSON)
	}
}
