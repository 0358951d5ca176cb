package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/proccluster"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/validator"
)

// TestDemoCluster runs `kiroku demo --cluster`: three server processes,
// the leader killed with SIGKILL, every acknowledged inspection on the
// new leader, the old member caught up.
func TestDemoCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes; run without -short (scripts/test.sh does)")
	}
	t.Setenv("KIROKU_TEST_RUN_MAIN", "1") // the children run this binary's main
	out, err := run(t, "demo", "--cluster", "--data-dir", t.TempDir())
	if err != nil {
		t.Fatalf("demo --cluster: %v\n%s", err, out)
	}
	for _, want := range []string{"took over", "ages 0–3: 4 versions valid", "serves boiler-7 with its 4 versions"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo --cluster output lacks %q:\n%s", want, out)
		}
	}
}

// The register the fault test drives: a write puts a value under a key,
// a read returns the key's value ("" if none). Both are ledger
// transactions (each records its nonce), so both go through the log.
const (
	regWrite = "def invoke(ledger, args):\n    ledger.put(args['k'], args['v'])\n    return args['v']\n"
	regRead  = "def invoke(ledger, args):\n    cur = ledger.get(args['k'])\n    return '' if cur == None else cur['value']\n"
)

type regOp struct {
	key, value string // value: written, or read
	write      bool
}

// registers is porcupine's model of one register per key.
var registers = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(regOp).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regOp)
		if in.write {
			return true, in.value
		}
		return output.(string) == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(regOp)
		if in.write {
			return fmt.Sprintf("%s ← %s", in.key, in.value)
		}
		return fmt.Sprintf("%s → %q", in.key, output)
	},
}

// faultHistory is what the clients saw.
type faultHistory struct {
	mu      sync.Mutex
	start   time.Time
	ops     []porcupine.Operation
	acked   map[string]regOp // nonce → write acknowledged
	written map[string]bool  // every value a write was sent with
}

func (h *faultHistory) now() int64 { return int64(time.Since(h.start)) }

// TestClusterFaults starts 3 and then 5 `kiroku server` processes and
// drives a register contract from concurrent SDK clients while the
// members are killed (SIGKILL), paused (SIGSTOP) and cut off from their
// peers (a proxy between each pair). Afterwards: the history is
// linearizable (porcupine; the same history with one read broken on
// purpose is not), and on every member in turn, made leader, every
// acknowledged write is committed with its version, every version is one
// a client wrote, and validate-ledger passes.
func TestClusterFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 and 5 server processes and faults them for a while; run without -short (scripts/test.sh does)")
	}
	dur := 12 * time.Second
	if d, err := time.ParseDuration(os.Getenv("KIROKU_FAULT_DURATION")); err == nil {
		dur = d
	}
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d members", n), func(t *testing.T) { faultRun(t, n, dur) })
	}
}

func faultRun(t *testing.T, nodes int, dur time.Duration) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const admin = "fault-test-admin-token-0123"
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := proccluster.Start(sctx, proccluster.Config{Exe: exe, Env: []string{"KIROKU_TEST_RUN_MAIN=1"}, Nodes: nodes,
		Dir: t.TempDir(), AdminToken: admin, Proxies: true, Args: []string{"--raft-tick", "50ms", "--log-level", "warn"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dumpLogs := func() {
		for _, id := range c.IDs() {
			b, _ := os.ReadFile(c.LogFile(id))
			t.Logf("member %d's log:\n%s", id, lastBytes(string(b), 3000))
		}
	}
	secret := make([]byte, 32)
	for i := range secret {
		secret[i] = byte(i)
	}
	cfg := client.Config{Server: c.Servers(), Entity: "fault", Secret: secret, AdminToken: admin, AttemptTimeout: 3 * time.Second,
		LeaderWait: 20 * time.Second}
	setup, err := client.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	if err := setup.RegisterSecret(sctx); err != nil {
		t.Fatal(err)
	}
	for id, src := range map[string]string{"reg.write": regWrite, "reg.read": regRead} {
		if err := setup.RegisterContract(sctx, id, []byte(src)); err != nil {
			t.Fatal(err)
		}
	}

	h := &faultHistory{start: time.Now(), acked: map[string]regOp{}, written: map[string]bool{}}
	keys := []string{"r0", "r1", "r2"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ci := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := client.Dial(cfg)
			if err != nil {
				t.Error(err)
				return
			}
			defer cl.Close()
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			cid := ci
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				in := regOp{key: keys[rng.IntN(len(keys))], write: rng.IntN(2) == 0}
				contract, arg := "reg.read", map[string]string{"k": in.key}
				if in.write {
					in.value = fmt.Sprintf("c%d-%d", ci, seq)
					contract, arg["v"] = "reg.write", in.value
				}
				b, _ := json.Marshal(arg)
				req, err := cl.NewRequest(contract, b)
				if err != nil {
					t.Error(err)
					return
				}
				h.mu.Lock()
				call := h.now()
				if in.write {
					h.written[in.value] = true
				}
				h.mu.Unlock()
				octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
				res, err := cl.ExecuteRequest(octx, req)
				ocancel()
				h.mu.Lock()
				switch {
				case err == nil:
					var out string
					if jerr := json.Unmarshal(res.Result, &out); jerr != nil {
						t.Errorf("result %s: %v", res.Result, jerr)
					}
					if in.write {
						h.acked[req.Nonce] = in
					}
					h.ops = append(h.ops, porcupine.Operation{ClientId: cid, Input: in, Call: call, Output: out, Return: h.now()})
				case in.write:
					// Its outcome is unknown: it may take effect at any
					// time after its call.
					h.ops = append(h.ops, porcupine.Operation{ClientId: cid, Input: in, Call: call, Output: "", Return: math.MaxInt64})
				}
				h.mu.Unlock()
				if err != nil {
					// A write in doubt stays open to the end of the
					// history: the client goes on under a new id, so that
					// one id's operations never overlap.
					cid += 100
				}
			}
		}()
	}

	// The nemesis.
	rng := rand.New(rand.NewPCG(uint64(nodes), 1))
	faults := 0
	deadline := time.Now().Add(dur)
	for i := 0; time.Now().Before(deadline); i++ {
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		lead, err := c.Leader(lctx)
		lcancel()
		if err != nil {
			dumpLogs()
			t.Fatalf("no leader during the run: %v", err)
		}
		victim := lead
		switch i % 4 {
		case 0:
			if err := c.Kill(victim); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			if err := c.Start(victim); err != nil {
				t.Fatal(err)
			}
		case 1:
			ids := c.IDs()
			for victim == lead {
				victim = ids[rng.IntN(len(ids))]
			}
			if err := c.Kill(victim); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			if err := c.Start(victim); err != nil {
				t.Fatal(err)
			}
		case 2:
			if err := c.Pause(victim); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			if err := c.Resume(victim); err != nil {
				t.Fatal(err)
			}
		case 3:
			c.Isolate(victim)
			time.Sleep(1500 * time.Millisecond)
			c.Heal()
		}
		faults++
		time.Sleep(time.Second)
	}
	close(stop)
	wg.Wait()
	c.Heal()
	for _, id := range c.IDs() {
		if err := c.WaitUp(sctx, id); err != nil {
			t.Fatal(err)
		}
	}

	h.mu.Lock()
	ops := h.ops
	h.mu.Unlock()
	done := 0
	for _, op := range ops {
		if op.Return != math.MaxInt64 {
			done++
		}
	}
	t.Logf("%d members, %d faults: %d operations acknowledged, %d writes acknowledged, %d in doubt", nodes, faults, done,
		len(h.acked), len(ops)-done)
	if done < 20 {
		dumpLogs()
		t.Fatalf("only %d operations were acknowledged: the cluster did not serve through the faults", done)
	}
	res, info := porcupine.CheckOperationsVerbose(registers, ops, time.Minute)
	if res != porcupine.Ok {
		if f, err := os.CreateTemp("", "kiroku-faults-*.html"); err == nil {
			_ = porcupine.Visualize(registers, info, f)
			f.Close()
			t.Logf("porcupine's visualisation: %s", f.Name())
		}
		t.Fatalf("the history is not linearizable (%v)", res)
	}
	// The checker must catch a broken history: a read answered with a
	// value never written.
	broken := append([]porcupine.Operation(nil), ops...)
	for i, op := range broken {
		if in := op.Input.(regOp); !in.write && op.Return != math.MaxInt64 {
			broken[i].Output = "never-written"
			break
		}
	}
	if porcupine.CheckOperations(registers, broken) {
		t.Fatal("porcupine accepted a history with a read of a value never written")
	}

	// Every member, leading in turn, holds every acknowledged write.
	var reference map[string][]string
	for _, id := range c.IDs() {
		if err := c.TransferLeader(sctx, id); err != nil {
			dumpLogs()
			t.Fatalf("handing the leadership to member %d: %v", id, err)
		}
		cl, err := client.Dial(client.Config{Server: c.Addr(id), Entity: "fault", Secret: secret, LeaderWait: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]string{}
		for _, k := range keys {
			vs, err := wholeHistory(sctx, cl, k)
			if err != nil {
				t.Fatalf("member %d: history of %s: %v", id, k, err)
			}
			for _, v := range vs {
				var val string
				if err := json.Unmarshal(v.Output, &val); err != nil || !h.written[val] {
					t.Fatalf("member %d: %s@%d holds %s, which no client wrote", id, k, v.Age, v.Output)
				}
				got[k] = append(got[k], val)
			}
			if len(vs) > 0 {
				vr, err := cl.ValidateLedger(sctx, k, 0, -1)
				if err != nil || !vr.Ok {
					t.Fatalf("member %d: validate-ledger %s: %v %+v", id, k, err, vr)
				}
			}
		}
		for nonce, w := range h.acked {
			st, err := cl.TxState(sctx, nonce)
			if err != nil || st.Status != ledger.TxCommitted {
				t.Fatalf("member %d: acknowledged write %s (%s ← %s): %+v, %v", id, nonce, w.key, w.value, st, err)
			}
			age, ok := st.Writes[w.key]
			if !ok || age >= int64(len(got[w.key])) || got[w.key][age] != w.value {
				t.Fatalf("member %d: acknowledged write %s ← %s is not version %d of its key (history %v)", id, w.key, w.value, age, got[w.key])
			}
		}
		if cl.Server() != c.Addr(id) {
			t.Errorf("member %d was made leader, but the client was sent to %s", id, cl.Server())
		}
		cl.Close()
		if reference == nil {
			reference = got
		} else if fmt.Sprint(reference) != fmt.Sprint(got) {
			t.Fatalf("member %d's histories differ from member %d's:\n%v\n%v", id, c.IDs()[0], got, reference)
		}
	}
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// wholeHistory reads every version of asset k, a page (the server's cap)
// at a time; none for an asset with no version.
func wholeHistory(ctx context.Context, cl *client.Client, k string) ([]*ledger.Version, error) {
	var out []*ledger.Version
	for {
		vs, err := cl.History(ctx, k, ledger.ScanRange{Start: int64(len(out)), End: -1, Ascending: true})
		if errors.Is(err, ledger.ErrNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			if v.Age != int64(len(out)) {
				return nil, fmt.Errorf("version %d where %d was due", v.Age, len(out))
			}
			out = append(out, v)
		}
		if len(vs) == 0 {
			return out, nil
		}
	}
}

// TestValidatorOnCluster: the Validator works unchanged against a
// cluster, across a failover: what it logged before and after the
// leader was killed validates without a violation.
func TestValidatorOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes; run without -short (scripts/test.sh does)")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const admin = "validator-test-admin-token"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := proccluster.Start(ctx, proccluster.Config{Exe: exe, Env: []string{"KIROKU_TEST_RUN_MAIN=1"}, Nodes: 3,
		Dir: t.TempDir(), AdminToken: admin, Args: []string{"--raft-tick", "50ms", "--log-level", "warn"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := client.Dial(client.Config{Server: c.Servers(), Entity: "auditor", Secret: make([]byte, 32), AdminToken: admin})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := engine.Open(engine.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, err := validator.Open(ctx, validator.Config{DB: db, Client: cl})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.RegisterContract(ctx, "reg.write", []byte(regWrite)); err != nil {
		t.Fatal(err)
	}
	write := func(i int) {
		t.Helper()
		if _, err := v.Execute(ctx, "reg.write", fmt.Appendf(nil, `{"k":"r%d","v":"v%d"}`, i%3, i)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for i := range 20 {
		write(i)
	}
	lead, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(lead); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 30; i++ {
		write(i)
	}
	rep, err := v.Validate(ctx, validator.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Committed != 30 {
		t.Fatalf("validation across the failover: %d committed, violations %+v", rep.Committed, rep.Violations)
	}
}
