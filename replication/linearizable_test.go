package replication

import (
	"fmt"
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/raft/v3"

	"github.com/kiroku-db/kiroku/transport/memnet"
	"github.com/kiroku-db/kiroku/wal"
)

// regInput is an operation on the register the simulation's state
// machine is: a write of value, or a read.
type regInput struct {
	write bool
	value string
}

// registerModel: the register holds the last value written; a read
// returns it.
var registerModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regInput)
		if in.write {
			return true, in.value
		}
		return output.(string) == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		if in := input.(regInput); in.write {
			return "write " + in.value
		}
		return fmt.Sprintf("read → %q", output)
	},
}

// regHistory records the clients' operations on the simulated cluster.
type regHistory struct {
	ops []porcupine.Operation
	// writes waiting for their proposer to apply them, by value: the
	// index of their operation and the proposer.
	writes map[string]regWrite
}

type regWrite struct {
	op       int
	proposer uint64
}

// TestLinearizableRegister drives a register on a simulated cluster of
// five nodes with message loss, reordering, partitions and crashes:
// writes through the leader, acknowledged once it applied them; reads on
// any node through ReadIndex. porcupine checks the history is
// linearizable; the same history with one read broken on purpose is not.
func TestLinearizableRegister(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			s := newSim(t, 100+seed, 5, wal.BatchPolicy())
			defer s.close()
			h := &regHistory{writes: map[string]regWrite{}}
			now := func() int64 { return s.net.Clock().Now().UnixNano() }
			// A client has one operation at a time, and gives up on it
			// after 100 steps (1 s): a read then tells nothing and is left
			// out; a write's outcome stays unknown (it may still apply).
			busy := make([]int, 6) // by client: the step its operation gives up at, 0 if idle
			next, stepNo := 0, 0
			step := func(faults bool) {
				stepNo++
				for c := range busy {
					if busy[c] != 0 && stepNo >= busy[c] {
						busy[c] = 0
					}
				}
				// Writes whose proposer applied them return now.
				for _, sn := range s.nodes {
					if sn.node == nil {
						continue
					}
					for _, e := range sn.sm.applied {
						if w, ok := h.writes[e.Data]; ok && w.proposer == sn.id {
							h.ops[w.op].Return = now()
							busy[h.ops[w.op].ClientId] = 0
							delete(h.writes, e.Data)
						}
					}
				}
				for c := range busy {
					if busy[c] != 0 || s.rng.IntN(4) != 0 {
						continue
					}
					sn := s.nodes[s.rng.IntN(len(s.nodes))]
					if sn.node == nil {
						continue
					}
					if s.rng.IntN(2) == 0 {
						if sn.node.Status().State != raft.StateLeader {
							continue
						}
						v := fmt.Sprint("v", next)
						next++
						if sn.node.Propose([]byte(v)) != nil {
							continue
						}
						h.ops = append(h.ops, porcupine.Operation{ClientId: c, Input: regInput{write: true, value: v}, Call: now(), Return: math.MaxInt64})
						h.writes[v] = regWrite{op: len(h.ops) - 1, proposer: sn.id}
						busy[c] = stepNo + 100
						continue
					}
					op := porcupine.Operation{ClientId: c, Input: regInput{}, Call: now()}
					giveUp := stepNo + 100
					busy[c] = giveUp
					node, sm := sn.node, sn.sm
					node.ReadIndex(func(_ uint64, err error) {
						if err != nil || stepNo >= giveUp {
							return // failed, or given up on: it told nothing
						}
						val := ""
						if n := len(sm.applied); n > 0 {
							val = sm.applied[n-1].Data
						}
						op.Output, op.Return = val, now()
						h.ops = append(h.ops, op)
						busy[c] = 0
					})
				}
				s.run(1, faults, false)
			}
			s.net.SetFaults(memnet.Faults{Drop: 0.02, Reorder: 0.05, DelayMin: 0, DelayMax: 3e6})
			for range 1500 {
				step(true)
			}
			s.net.HealAll()
			s.net.SetFaults(memnet.Faults{})
			for _, sn := range s.nodes {
				if sn.node == nil {
					s.start(sn)
				}
			}
			for range 300 {
				step(false)
			}
			reads, writes, unknown := 0, 0, 0
			for _, op := range h.ops {
				switch {
				case !op.Input.(regInput).write:
					reads++
				case op.Return == math.MaxInt64:
					unknown++
				default:
					writes++
				}
			}
			t.Logf("%d reads, %d writes acknowledged, %d of unknown outcome", reads, writes, unknown)
			if reads < 50 || writes < 50 {
				t.Fatalf("too few operations to say anything: %d reads, %d writes", reads, writes)
			}
			if !porcupine.CheckOperations(registerModel, h.ops) {
				t.Fatal("the register's history is not linearizable")
			}
			// Broken on purpose: a read that returned after a write was
			// acknowledged says the register still held its initial value.
			broken := append([]porcupine.Operation(nil), h.ops...)
			var firstWriteDone int64 = math.MaxInt64
			for _, op := range broken {
				if op.Input.(regInput).write && op.Return < firstWriteDone {
					firstWriteDone = op.Return
				}
			}
			for i, op := range broken {
				if !op.Input.(regInput).write && op.Call > firstWriteDone {
					broken[i].Output = ""
					break
				}
			}
			if porcupine.CheckOperations(registerModel, broken) {
				t.Fatal("porcupine accepted a read of the initial value after a write was acknowledged")
			}
		})
	}
}
