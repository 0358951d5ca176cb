package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/replication"
	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/grpcnet"
	"github.com/kiroku-db/kiroku/wal"
)

// RaftConfig is seed 001's experiment: PUTs to a Raft group of Nodes on
// this machine, each node's log on disk, with the followers' (and the
// leader's) log made durable under each policy of Policies.
type RaftConfig struct {
	Nodes      int
	Clients    []int
	ValueSizes []int
	KeySize    int
	// Policies name the log's durability: "entry" (an fsync per entry,
	// the node waiting for each: seed 001's baseline), "append" (an fsync
	// per append message, waited for: a Raft driver without asynchronous
	// storage writes), "batch" (asynchronous appends, one fsync for what
	// is pending when the last ends), "count:N" (one fsync per N entries
	// or MaxWait: seed 001's bulk fsync), "group:D" (one per window D),
	// "none" (never: unsafe).
	Policies []string
	MaxWait  time.Duration
	Warmup   time.Duration
	Duration time.Duration
	Dir      string // parent of the nodes' directories; "" is the temp dir
}

// RaftPoint is one run's figures.
type RaftPoint struct {
	Policy    string  `json:"policy"`
	Unsafe    bool    `json:"unsafe,omitempty"`
	Clients   int     `json:"clients"`
	ValueSize int     `json:"value_size"`
	Puts      int64   `json:"puts"`
	PutsPerS  float64 `json:"puts_per_s"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	// CPUus is the CPU time of the whole process (every node, every
	// client) per acknowledged put, in µs.
	CPUus float64 `json:"cpu_us_per_put"`
}

// RaftPolicy is how a node makes its log durable in a run.
type RaftPolicy struct {
	Log       wal.Policy
	Serial    bool // replication.Config.SerialAppends
	EachEntry bool // replication.Config.SyncEachEntry
	Unsafe    bool // never synced
}

// ParseRaftPolicy reads a policy name of RaftConfig.Policies.
func ParseRaftPolicy(name string, maxWait time.Duration) (RaftPolicy, error) {
	kind, arg, _ := strings.Cut(name, ":")
	switch {
	case name == "entry":
		return RaftPolicy{Log: wal.BatchPolicy(), Serial: true, EachEntry: true}, nil
	case name == "append":
		return RaftPolicy{Log: wal.BatchPolicy(), Serial: true}, nil
	case name == "batch":
		return RaftPolicy{Log: wal.BatchPolicy()}, nil
	case name == "none":
		return RaftPolicy{Log: wal.PeriodicPolicy(time.Hour), Unsafe: true}, nil
	case kind == "count":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			return RaftPolicy{}, fmt.Errorf("bench: policy %q: count:N needs N ≥ 1", name)
		}
		return RaftPolicy{Log: wal.CountPolicy(n, maxWait)}, nil
	case kind == "group":
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 {
			return RaftPolicy{}, fmt.Errorf("bench: policy %q: group:D needs a duration", name)
		}
		return RaftPolicy{Log: wal.GroupPolicy(d)}, nil
	}
	return RaftPolicy{}, fmt.Errorf("bench: unknown policy %q (entry, append, batch, count:N, group:D, none)", name)
}

// RunRaft runs every combination of policy, value size and client count,
// each on a fresh cluster, and hands each point to out as it is measured.
func RunRaft(ctx context.Context, cfg RaftConfig, out func(RaftPoint)) ([]RaftPoint, error) {
	if cfg.Nodes < 1 || cfg.Nodes > 7 {
		return nil, fmt.Errorf("bench: %d nodes, want 1..7", cfg.Nodes)
	}
	if cfg.KeySize < 8 {
		return nil, fmt.Errorf("bench: keys of %d bytes, want at least 8", cfg.KeySize)
	}
	var points []RaftPoint
	for _, pol := range cfg.Policies {
		if _, err := ParseRaftPolicy(pol, cfg.MaxWait); err != nil {
			return nil, err
		}
	}
	for _, vs := range cfg.ValueSizes {
		for _, clients := range cfg.Clients {
			for _, pol := range cfg.Policies {
				pt, err := runRaftPoint(ctx, cfg, pol, clients, vs)
				if err != nil {
					return points, err
				}
				points = append(points, pt)
				if out != nil {
					out(pt)
				}
			}
		}
	}
	return points, nil
}

// raftKV is the benchmark's state machine: it counts what it applies and
// wakes the client whose put it is, on the node that waits for it.
type raftKV struct {
	mu      sync.Mutex
	waiters map[uint64]chan struct{}
}

func (s *raftKV) Apply(_ uint64, data []byte) error {
	id, n := binary.Uvarint(data)
	if n <= 0 {
		return errors.New("bench: a put without its id")
	}
	s.mu.Lock()
	ch := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return nil
}

func (s *raftKV) Restore(uint64, []byte) error { return nil }

func (s *raftKV) wait(id uint64) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[id] = ch
	s.mu.Unlock()
	return ch
}

func (s *raftKV) forget(id uint64) {
	s.mu.Lock()
	delete(s.waiters, id)
	s.mu.Unlock()
}

type raftBenchNode struct {
	n    *replication.Node
	run  *replication.Runner
	kv   *raftKV
	tr   *grpcnet.Transport
	srv  *grpc.Server
	dead bool
}

// raftCluster is a group of benchmark nodes in this process.
type raftCluster struct {
	dir   string
	nodes []*raftBenchNode
}

// startRaftCluster starts nodes nodes in a fresh directory under parent,
// each with its log under policy.
func startRaftCluster(parent string, nodes int, policy RaftPolicy) (*raftCluster, error) {
	dir, err := os.MkdirTemp(parent, "kiroku-bench-raft-")
	if err != nil {
		return nil, err
	}
	c := &raftCluster{dir: dir}
	addrs := map[transport.NodeID]string{}
	var peers []uint64
	var lis []net.Listener
	for i := range nodes {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.close()
			return nil, err
		}
		lis = append(lis, l)
		addrs[transport.NodeID(i+1)] = l.Addr().String()
		peers = append(peers, uint64(i+1))
	}
	for i, id := range peers {
		kv := &raftKV{waiters: map[uint64]chan struct{}{}}
		n, err := replication.Open(replication.Config{ID: id, ClusterID: "bench", Peers: peers, Dir: filepath.Join(dir, fmt.Sprint(id)),
			PreVote: true, CheckQuorum: true, Sync: policy.Log, SerialAppends: policy.Serial, SyncEachEntry: policy.EachEntry, MaxUncommittedEntriesSize: 1 << 30,
			MaxSizePerMsg: 4 << 20, SegmentSize: 256 << 20}, kv)
		if err != nil {
			c.close()
			return nil, err
		}
		run := replication.NewRunner(n)
		tr, err := grpcnet.New(grpcnet.Config{NodeID: transport.NodeID(id), ClusterID: "bench", Peers: addrs,
			QueueBytes: 256 << 20, BatchBytes: 4 << 20}, run.Handler())
		if err != nil {
			n.Close()
			c.close()
			return nil, err
		}
		n.SetTransport(tr)
		srv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
		tr.Register(srv)
		go srv.Serve(lis[i])
		run.Start()
		c.nodes = append(c.nodes, &raftBenchNode{n: n, run: run, kv: kv, tr: tr, srv: srv})
	}
	return c, nil
}

// kill stops a node as a crash would look to its peers.
func (b *raftBenchNode) kill() {
	b.run.Stop()
	b.srv.Stop()
	b.tr.Close()
	b.n.Close()
	b.dead = true
}

func (c *raftCluster) close() {
	for _, b := range c.nodes {
		if !b.dead {
			b.kill()
		}
	}
	os.RemoveAll(c.dir)
}

func runRaftPoint(ctx context.Context, cfg RaftConfig, pol string, clients, valueSize int) (RaftPoint, error) {
	policy, _ := ParseRaftPolicy(pol, cfg.MaxWait)
	pt := RaftPoint{Policy: pol, Unsafe: policy.Unsafe, Clients: clients, ValueSize: valueSize}
	c, err := startRaftCluster(cfg.Dir, cfg.Nodes, policy)
	if err != nil {
		return pt, err
	}
	defer c.close()
	nodes := c.nodes
	leader, err := raftLeader(ctx, nodes, 10*time.Second)
	if err != nil {
		return pt, err
	}
	var (
		stop     atomic.Bool
		measure  atomic.Bool
		puts     atomic.Int64
		nextID   atomic.Uint64
		mu       sync.Mutex
		lat      = hdrhistogram.New(1, 60_000_000, 3)
		firstErr error
		wg       sync.WaitGroup
	)
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			local := hdrhistogram.New(1, 60_000_000, 3)
			defer func() {
				mu.Lock()
				lat.Merge(local)
				mu.Unlock()
			}()
			value := make([]byte, valueSize)
			for !stop.Load() {
				id := nextID.Add(1)
				data := binary.AppendUvarint(make([]byte, 0, 10+cfg.KeySize+valueSize), id)
				key := make([]byte, cfg.KeySize)
				binary.LittleEndian.PutUint64(key, rng.Uint64())
				data = append(append(data, key...), value...)
				ch := leader.kv.wait(id)
				start := time.Now()
				if err := leader.run.Propose(ctx, data); err != nil {
					leader.kv.forget(id)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					stop.Store(true)
					return
				}
				select {
				case <-ch:
				case <-time.After(30 * time.Second):
					mu.Lock()
					if firstErr == nil {
						firstErr = errors.New("bench: a put not committed within 30 s")
					}
					mu.Unlock()
					stop.Store(true)
					return
				}
				if measure.Load() {
					puts.Add(1)
					local.RecordValue(time.Since(start).Microseconds())
				}
			}
		})
	}
	cpu := CPUClock()
	time.Sleep(cfg.Warmup)
	c0, err := cpu()
	if err != nil {
		return pt, err
	}
	measure.Store(true)
	t0 := time.Now()
	time.Sleep(cfg.Duration)
	// A point needs a measured put: on a slow or busy disk one fsync can
	// outlast a short window.
	for puts.Load() == 0 && time.Since(t0) < 30*time.Second && !stop.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	measure.Store(false)
	elapsed := time.Since(t0)
	c1, _ := cpu()
	stop.Store(true)
	wg.Wait()
	if firstErr != nil {
		return pt, firstErr
	}
	pt.Puts = puts.Load()
	pt.PutsPerS = float64(pt.Puts) / elapsed.Seconds()
	pt.P50ms = float64(lat.ValueAtQuantile(50)) / 1000
	pt.P99ms = float64(lat.ValueAtQuantile(99)) / 1000
	if pt.Puts > 0 {
		pt.CPUus = float64((c1 - c0).Microseconds()) / float64(pt.Puts)
	}
	return pt, nil
}

// raftLeader waits for a node that leads.
func raftLeader(ctx context.Context, nodes []*raftBenchNode, within time.Duration) (*raftBenchNode, error) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, b := range nodes {
			if b.dead {
				continue
			}
			st, err := b.run.Status(ctx)
			if err != nil {
				return nil, err
			}
			if st.Leader == st.ID {
				return b, nil
			}
		}
	}
	return nil, errors.New("bench: no leader elected")
}

// RaftFailover measures failover: with clients putting through the leader
// of a group under the batch policy and the default election settings
// (100 ms ticks, an election timeout of 1 to 2 s), the leader is stopped
// and the time until a put is acknowledged by a new leader is taken.
// It repeats trials times and returns each time.
func RaftFailover(ctx context.Context, nodes, trials int, dir string) ([]time.Duration, error) {
	var out []time.Duration
	for range trials {
		c, err := startRaftCluster(dir, nodes, RaftPolicy{Log: wal.BatchPolicy()})
		if err != nil {
			return out, err
		}
		d, err := failoverOnce(ctx, c)
		c.close()
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

func failoverOnce(ctx context.Context, c *raftCluster) (time.Duration, error) {
	leader, err := raftLeader(ctx, c.nodes, 10*time.Second)
	if err != nil {
		return 0, err
	}
	put := func(b *raftBenchNode, id uint64) bool {
		ch := b.kv.wait(id)
		if err := b.run.Propose(ctx, binary.AppendUvarint(nil, id)); err != nil {
			b.kv.forget(id)
			return false
		}
		select {
		case <-ch:
			return true
		case <-time.After(200 * time.Millisecond):
			b.kv.forget(id)
			return false
		}
	}
	var id uint64
	for range 100 { // a steady state first
		id++
		put(leader, id)
	}
	killed := time.Now()
	leader.kill()
	for time.Since(killed) < 30*time.Second {
		next, err := raftLeader(ctx, c.nodes, 30*time.Second)
		if err != nil {
			return 0, err
		}
		id++
		if put(next, id) {
			return time.Since(killed), nil
		}
	}
	return 0, errors.New("bench: no put acknowledged within 30 s of the leader's death")
}

// EtcdPeerConfig is the etcd side of RunRaft's comparison: the program
// bench/etcdpeer, a module of its own (so that etcd stays out of kiroku's
// go.mod), starts Members embedded etcd members on loopback in one process
// and has clients put through the leader with etcd's client library.
type EtcdPeerConfig struct {
	Members    int
	Clients    []int
	ValueSizes []int
	KeySize    int
	Warmup     time.Duration
	Duration   time.Duration
	Dir        string // parent of the members' directories; "" is the temp dir
}

// EtcdPoint is one run of the etcd peer. Its figures mean what RaftPoint's
// do: puts acknowledged to clients that each wait for their put, and the
// CPU time of the whole process (every member and every client) per put.
type EtcdPoint struct {
	System    string  `json:"system"`
	Version   string  `json:"version"`
	Members   int     `json:"members"`
	Clients   int     `json:"clients"`
	Conns     int     `json:"conns"`
	ValueSize int     `json:"value_size"`
	KeySize   int     `json:"key_size"`
	Puts      int64   `json:"puts"`
	Errors    int64   `json:"errors"`
	PutsPerS  float64 `json:"puts_per_s"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	CPUus     float64 `json:"cpu_us_per_put"`
}

// etcdPeerModule is the module path of bench/etcdpeer/go.mod.
const etcdPeerModule = "github.com/kiroku-db/kiroku/bench/etcdpeer"

// FindEtcdPeer returns the directory of the module bench/etcdpeer: dir
// itself if it is not "", else the one in the kiroku checkout that holds
// the working directory, else the one beside this package's source as it
// was compiled (which `go run ./cmd/kiroku` from anywhere in the checkout
// finds).
func FindEtcdPeer(dir string) (string, error) {
	isPeer := func(d string) bool {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		return err == nil && bytes.HasPrefix(b, []byte("module "+etcdPeerModule+"\n"))
	}
	if dir != "" {
		if !isPeer(dir) {
			return "", fmt.Errorf("bench: %s is not the module %s", dir, etcdPeerModule)
		}
		return dir, nil
	}
	var tried []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if c := filepath.Join(d, "bench", "etcdpeer"); isPeer(c) {
				return c, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
		tried = append(tried, "above "+wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		c := filepath.Join(filepath.Dir(file), "etcdpeer")
		if isPeer(c) {
			return c, nil
		}
		tried = append(tried, c)
	}
	return "", fmt.Errorf("bench: the module bench/etcdpeer is not in a kiroku checkout %s; run from one, or name it", strings.Join(tried, " nor "))
}

// BuildEtcdPeer builds the program of module directory dir with the go
// command into a fresh temporary directory, and returns the binary and a
// function that removes it. The first build downloads etcd's modules and
// takes a minute or so on two cores; later ones come from Go's cache.
func BuildEtcdPeer(ctx context.Context, dir string) (bin string, remove func(), err error) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		return "", nil, fmt.Errorf("bench: building the etcd peer needs the go command: %w", err)
	}
	tmp, err := os.MkdirTemp("", "kiroku-etcdpeer-")
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(tmp) }
	bin = filepath.Join(tmp, "etcdpeer")
	cmd := exec.CommandContext(ctx, gocmd, "build", "-o", bin, ".")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		remove()
		msg := strings.TrimSpace(out.String())
		if len(msg) > 2000 {
			msg = "…" + msg[len(msg)-2000:]
		}
		return "", nil, fmt.Errorf("bench: go build in %s: %w\n%s", dir, err, msg)
	}
	return bin, remove, nil
}

// RunEtcdPeer runs the etcd peer's binary bin (see BuildEtcdPeer) on cfg
// and returns its points. Its progress goes to progress.
func RunEtcdPeer(ctx context.Context, bin string, cfg EtcdPeerConfig, progress io.Writer) ([]EtcdPoint, error) {
	list := func(ns []int) string {
		s := make([]string, len(ns))
		for i, n := range ns {
			s[i] = strconv.Itoa(n)
		}
		return strings.Join(s, ",")
	}
	args := []string{"--members", strconv.Itoa(cfg.Members), "--clients", list(cfg.Clients), "--value-sizes", list(cfg.ValueSizes),
		"--key-size", strconv.Itoa(cfg.KeySize), "--warmup", cfg.Warmup.String(), "--duration", cfg.Duration.String(), "--json"}
	if cfg.Dir != "" {
		args = append(args, "--dir", cfg.Dir)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, progress
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench: the etcd peer: %w", err)
	}
	var points []EtcdPoint
	if err := json.Unmarshal(out.Bytes(), &points); err != nil {
		return nil, fmt.Errorf("bench: the etcd peer's output: %w", err)
	}
	return points, nil
}
