// Command etcdpeer measures etcd as the peer of `kiroku bench raft`: it
// starts a group of embedded etcd members on loopback, in this process,
// and has clients put keys through the leader with client/v3, each client
// waiting for its put before the next, as kiroku's benchmark does.
//
// It is a module of its own so that etcd stays out of kiroku's go.mod;
// `kiroku bench raft --etcd` builds and runs it. Run alone:
//
//	cd bench/etcdpeer && go run . --clients 1,1000 --value-sizes 100,100000 --duration 10s
//
// Every combination of value size and client count runs on a fresh group
// in a fresh directory, removed afterwards. etcd keeps its defaults where
// they bear on durability and cost: it fsyncs its WAL before a member
// acknowledges, and snapshots every 10,000 entries. Three settings differ:
//
//   - keys are drawn at random from a key space of --keyspace keys (10,000
//     by default), so that live data stays bounded (1 GB at 100 kB values);
//   - periodic auto-compaction keeps --compaction-retention of history (2 s
//     by default), so that old revisions of 100 kB values do not pile up;
//   - the backend quota is 8 GiB, etcd's suggested maximum, rather than 2 GiB.
//
// Without the last two, 100 kB values at a few thousand puts/s reach the
// 2 GiB quota within seconds and etcd refuses puts (NOSPACE).
//
// CPU time per put is the whole process's (every member and every client),
// from getrusage, as in kiroku's benchmark.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"
)

// Point is one run's figures. Its JSON names are those of kiroku's
// bench.RaftPoint where the figures mean the same.
type Point struct {
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
	// CPUus is the CPU time of the whole process per acknowledged put, in µs.
	CPUus float64 `json:"cpu_us_per_put"`
}

type config struct {
	members    int
	clients    []int
	valueSizes []int
	keySize    int
	keyspace   uint64
	conns      int
	warmup     time.Duration
	duration   time.Duration
	dir        string
	retention  time.Duration
	quota      int64
	logger     *zap.Logger
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "etcdpeer:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg             config
		clients, values string
		logFile         string
		asJSON          bool
	)
	flag.IntVar(&cfg.members, "members", 3, "etcd members in the group")
	flag.StringVar(&clients, "clients", "1,1000", "comma-separated client counts")
	flag.StringVar(&values, "value-sizes", "100,100000", "comma-separated value sizes in bytes")
	flag.IntVar(&cfg.keySize, "key-size", 8, "key bytes (at least 8)")
	flag.Uint64Var(&cfg.keyspace, "keyspace", 10_000, "distinct keys the puts are drawn from")
	flag.IntVar(&cfg.conns, "conns", 0, "client connections (gRPC) shared by the clients; 0: one per 10 clients, at most 100")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unmeasured run before each point")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured run per point")
	flag.StringVar(&cfg.dir, "dir", "", "parent directory of the members' data (default: the temp dir)")
	flag.DurationVar(&cfg.retention, "compaction-retention", 2*time.Second, "history kept by etcd's periodic auto-compaction")
	flag.Int64Var(&cfg.quota, "quota-backend-bytes", 8<<30, "etcd's backend quota")
	flag.StringVar(&logFile, "log", "", "write etcd's log to this file (default: discarded)")
	flag.BoolVar(&asJSON, "json", false, "print a JSON array of points")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	var err error
	if cfg.clients, err = intList(clients); err != nil {
		return err
	}
	if cfg.valueSizes, err = intList(values); err != nil {
		return err
	}
	if cfg.members < 1 || cfg.members > 7 {
		return fmt.Errorf("%d members, want 1..7", cfg.members)
	}
	if cfg.keySize < 8 {
		return fmt.Errorf("keys of %d bytes, want at least 8", cfg.keySize)
	}
	if cfg.keyspace < 1 {
		return errors.New("--keyspace must be positive")
	}
	cfg.logger = zap.NewNop()
	if logFile != "" {
		zc := zap.NewProductionConfig()
		zc.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
		zc.OutputPaths = []string{logFile}
		zc.ErrorOutputPaths = []string{logFile}
		if cfg.logger, err = zc.Build(); err != nil {
			return err
		}
		defer cfg.logger.Sync()
	}
	// gRPC's own log goes to stderr by default; nothing of it is wanted.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(discard{}, discard{}, discard{}))

	fmt.Fprintf(os.Stderr, "etcdpeer: etcd %s, %d members, %s per run after %s warmup\n", version.Version, cfg.members, cfg.duration, cfg.warmup)
	var points []Point
	for _, vs := range cfg.valueSizes {
		for _, c := range cfg.clients {
			pt, err := runPoint(context.Background(), cfg, c, vs)
			if err != nil {
				return fmt.Errorf("%d clients, %d-byte values: %w", c, vs, err)
			}
			fmt.Fprintf(os.Stderr, "  etcd, %d clients, %d-byte values: %.0f puts/s, p50 %.2f ms\n", pt.Clients, pt.ValueSize, pt.PutsPerS, pt.P50ms)
			points = append(points, pt)
		}
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(points)
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "value B\tclients\tputs/s\tp50 ms\tp99 ms\tCPU µs/put\terrors\t")
	for _, p := range points {
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.2f\t%.2f\t%.0f\t%d\t\n", p.ValueSize, p.Clients, p.PutsPerS, p.P50ms, p.P99ms, p.CPUus, p.Errors)
	}
	return tw.Flush()
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// group is a running etcd group in this process.
type group struct {
	dir     string
	members []*embed.Etcd
	clients []string // each member's client URL
}

func (g *group) close() {
	for _, e := range g.members {
		e.Close()
	}
	os.RemoveAll(g.dir)
}

// freePorts returns n TCP ports of loopback that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func startGroup(cfg config, valueSize int) (*group, error) {
	dir, err := os.MkdirTemp(cfg.dir, "kiroku-bench-etcd-")
	if err != nil {
		return nil, err
	}
	g := &group{dir: dir}
	ports, err := freePorts(2 * cfg.members)
	if err != nil {
		g.close()
		return nil, err
	}
	u := func(port int) url.URL { return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)} }
	var initial []string
	for i := range cfg.members {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	maxReq := uint(embed.DefaultMaxRequestBytes)
	if need := uint(cfg.keySize+valueSize) + 64<<10; need > maxReq {
		maxReq = need
	}
	for i := range cfg.members {
		ec := embed.NewConfig()
		ec.Name = fmt.Sprintf("m%d", i+1)
		ec.Dir = filepath.Join(dir, ec.Name)
		client, peer := u(ports[2*i]), u(ports[2*i+1])
		ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		ec.InitialCluster = strings.Join(initial, ",")
		ec.InitialClusterToken = filepath.Base(dir)
		ec.ClusterState = embed.ClusterStateFlagNew
		ec.QuotaBackendBytes = cfg.quota
		ec.MaxRequestBytes = maxReq
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.retention.String()
		ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(cfg.logger.Named(ec.Name))
		e, err := embed.StartEtcd(ec)
		if err != nil {
			g.close()
			return nil, fmt.Errorf("starting member %s: %w", ec.Name, err)
		}
		g.members = append(g.members, e)
		g.clients = append(g.clients, client.String())
	}
	for _, e := range g.members {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			g.close()
			return nil, err
		case <-time.After(60 * time.Second):
			g.close()
			return nil, errors.New("etcd members not ready within 60 s")
		}
	}
	return g, nil
}

// leader waits for a member that leads and returns its client URL.
func (g *group) leader(within time.Duration) (string, error) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for i, e := range g.members {
			if lead := e.Server.Lead(); lead != 0 && lead == uint64(e.Server.MemberID()) {
				return g.clients[i], nil
			}
		}
	}
	return "", errors.New("no etcd leader elected")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func runPoint(ctx context.Context, cfg config, clients, valueSize int) (Point, error) {
	pt := Point{System: "etcd", Version: version.Version, Members: cfg.members, Clients: clients, ValueSize: valueSize, KeySize: cfg.keySize}
	g, err := startGroup(cfg, valueSize)
	if err != nil {
		return pt, err
	}
	defer g.close()
	endpoint, err := g.leader(30 * time.Second)
	if err != nil {
		return pt, err
	}
	conns := cfg.conns
	if conns <= 0 {
		conns = min(100, (clients+9)/10)
	}
	conns = min(conns, clients)
	pt.Conns = conns
	pool := make([]*clientv3.Client, conns)
	defer func() {
		for _, c := range pool {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i := range pool {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
			MaxCallSendMsgSize: int(2*valueSize + 1<<20)})
		if err != nil {
			return pt, err
		}
		pool[i] = c
	}
	var (
		stop     atomic.Bool
		measure  atomic.Bool
		puts     atomic.Int64
		errs     atomic.Int64
		mu       sync.Mutex
		lats     []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	value := string(make([]byte, valueSize))
	for c := range clients {
		wg.Go(func() {
			cli := pool[c%len(pool)]
			rng := rand.New(rand.NewPCG(uint64(c), 2))
			key := make([]byte, cfg.keySize)
			var local []time.Duration
			defer func() {
				mu.Lock()
				lats = append(lats, local...)
				mu.Unlock()
			}()
			for !stop.Load() {
				binary.BigEndian.PutUint64(key, rng.Uint64N(cfg.keyspace))
				pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				start := time.Now()
				_, err := cli.Put(pctx, string(key), value)
				d := time.Since(start)
				cancel()
				if err != nil {
					if stop.Load() {
						return
					}
					errs.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if measure.Load() {
					puts.Add(1)
					local = append(local, d)
				}
			}
		})
	}
	time.Sleep(cfg.warmup)
	errs.Store(0)
	c0 := cpuTime()
	measure.Store(true)
	t0 := time.Now()
	time.Sleep(cfg.duration)
	measure.Store(false)
	elapsed := time.Since(t0)
	c1 := cpuTime()
	pt.Errors = errs.Load()
	stop.Store(true)
	wg.Wait()
	pt.Puts = puts.Load()
	if pt.Puts == 0 {
		if firstErr != nil {
			return pt, fmt.Errorf("no put acknowledged: %w", firstErr)
		}
		return pt, errors.New("no put acknowledged")
	}
	if pt.Errors > 0 {
		fmt.Fprintf(os.Stderr, "etcdpeer: %d puts failed while measuring, the first: %v\n", pt.Errors, firstErr)
	}
	slices.Sort(lats)
	q := func(f float64) float64 {
		return float64(lats[min(len(lats)-1, int(f*float64(len(lats))))].Microseconds()) / 1000
	}
	pt.PutsPerS = float64(pt.Puts) / elapsed.Seconds()
	pt.P50ms, pt.P99ms = q(0.50), q(0.99)
	pt.CPUus = float64((c1 - c0).Microseconds()) / float64(pt.Puts)
	return pt, nil
}

// intList parses "1,64,1000".
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers separated by commas", s)
		}
		out = append(out, n)
	}
	return out, nil
}
