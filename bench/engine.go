package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/replication"
	"github.com/kiroku-db/kiroku/storage"
)

// EngineConfig configures one run of the engine benchmark.
type EngineConfig struct {
	Workload    string // ycsb-wo, ycsb-a, ycsb-c or ycsb-f
	OpsPerTxn   int
	Records     int
	KeySize     int // bytes, at least 8
	ValueSize   int // bytes
	Threads     int // workers that commit without waiting for durability
	SyncClients int // clients that wait for durability after each commit
	Log         string
	Epoch       time.Duration
	Duration    time.Duration
	// LogBuffer is the size at which a worker hands its log buffer to the
	// logger (engine.Config.LogBufferSize); 0 keeps the engine's default.
	LogBuffer int
	// RoundsInFlight is engine.Config.LogRoundsInFlight; 0 keeps the
	// engine's default.
	RoundsInFlight int
	// Replicas, above 0, replicates the engine's log through a Raft group
	// of Replicas+1 members in this process (package replication, seed
	// 002): the workload runs on the leader, and the followers apply the
	// log (hot standby). 0 is the engine with its local WAL.
	Replicas int
	// PersistOnly, with Replicas, has the followers keep the log without
	// applying it (seed 002's setting) instead of hot standbys.
	PersistOnly bool
	// CheckpointLogSize is engine.Config.CheckpointLogSize; 0 keeps the
	// engine's default (tests make it small).
	CheckpointLogSize int64
	Dir               string // parent of the run's data directory
	// Recovery checkpoints after the load, runs the workload, closes the
	// engine and times reopening it: loading the checkpoint and replaying
	// the log written during the run. With Log "none" it does nothing: an
	// engine without a log has no checkpoints and recovers nothing.
	Recovery bool
	// DiskLoad, with Log "none", writes in the background during the
	// measured window what the disk was asked to write in a run with the
	// log (see DiskLoad).
	DiskLoad *DiskLoad
}

// EngineResult is one run's figures.
type EngineResult struct {
	Workload       string  `json:"workload"`
	Log            string  `json:"log"`
	Threads        int     `json:"threads"`
	SyncClients    int     `json:"sync_clients"`
	Seconds        float64 `json:"seconds"`
	LoadSeconds    float64 `json:"load_seconds"`
	Committed      int64   `json:"committed"`
	Aborted        int64   `json:"aborted"`
	TxnPerSec      float64 `json:"committed_per_s"`
	AbortRate      float64 `json:"abort_rate"`
	SyncTxnPerSec  float64 `json:"sync_durable_per_s"`
	DurableP50     float64 `json:"commit_to_durable_p50_ms"`
	DurableP99     float64 `json:"commit_to_durable_p99_ms"`
	DurableSamples int64   `json:"commit_to_durable_samples"`
	// SyncP50 and SyncP99: the sync clients' begin-to-durable latency.
	SyncP50 float64 `json:"sync_begin_to_durable_p50_ms"`
	SyncP99 float64 `json:"sync_begin_to_durable_p99_ms"`
	// CPUMicros is the process's CPU time (user plus system, every
	// goroutine: workers, loggers, collector) over the measured window per
	// committed transaction. Kernel writeback threads are not in it.
	CPUMicros float64 `json:"cpu_us_per_txn"`
	// DiskWriteRate is the bytes a second the process asked the disk to
	// write over the measured window (Linux; -1 elsewhere): the log's
	// records, its zero-fill and checkpoints, or a DiskLoad's writes.
	DiskWriteRate float64 `json:"disk_write_bytes_per_s"`
	// LogSpan is the size of the log's files at the end of a wal run.
	LogSpan int64 `json:"log_span_bytes,omitempty"`
	// Replicas is the followers the log was replicated to, and
	// ReplicatedBytesPerTxn the engine log bytes proposed to them per
	// committed transaction (Raft's entry framing not counted).
	Replicas              int     `json:"replicas,omitempty"`
	ReplicatedBytesPerTxn float64 `json:"replicated_bytes_per_txn,omitempty"`
	// CPUByMember, with Replicas, divides CPUMicros among the members
	// (by their ids; the leader's is the one whose engine the clients
	// call) and the clients' goroutines (""), from a CPU profile of the
	// measured window (sampled: the parts add up to about CPUMicros).
	CPUByMember map[string]float64 `json:"cpu_us_per_txn_by_member,omitempty"`
	// Leader is the id of the member that led.
	Leader uint64 `json:"leader,omitempty"`
	// DiskLoad is the run's background writes, if it had them.
	DiskLoad *DiskLoad `json:"disk_load,omitempty"`
	// With Recovery:
	CheckpointSeconds float64 `json:"checkpoint_seconds,omitempty"`
	LogBytes          int64   `json:"log_bytes,omitempty"`
	RecoverySeconds   float64 `json:"recovery_seconds,omitempty"`
}

func (c *EngineConfig) validate() error {
	switch c.Workload {
	case "ycsb-wo", "ycsb-a", "ycsb-c", "ycsb-f":
	default:
		return fmt.Errorf("unknown workload %q (ycsb-wo, ycsb-a, ycsb-c, ycsb-f)", c.Workload)
	}
	switch {
	case c.Log != "wal" && c.Log != "none":
		return fmt.Errorf("unknown log %q (wal, none)", c.Log)
	case c.OpsPerTxn < 1, c.Records < 1, c.KeySize < 8, c.ValueSize < 1:
		return errors.New("ops-per-txn and records must be positive, key-size at least 8, value-size positive")
	case c.Threads < 0 || c.SyncClients < 0 || c.Threads+c.SyncClients == 0:
		return errors.New("need at least one thread or sync client")
	case c.Duration <= 0:
		return errors.New("duration must be positive")
	case c.DiskLoad != nil && (c.Log != "none" || !(c.DiskLoad.Rate > 0)):
		return errors.New("a disk load needs log none and a positive rate")
	case c.Replicas < 0 || c.Replicas > 6:
		return errors.New("replicas must be 0..6")
	case c.Replicas > 0 && (c.Log != "wal" || c.Recovery || c.DiskLoad != nil):
		return errors.New("replicas need log wal, and no recovery or disk load")
	}
	return nil
}

type commitSample struct {
	epoch uint64
	at    int64 // ns since start
}

// RunEngine loads Records rows into a fresh engine and runs the workload:
// Threads workers commit without waiting (Silo's workers; durability is
// tracked by a watcher) and SyncClients wait for durability after each
// commit, as a server answering clients would.
func RunEngine(ctx context.Context, cfg EngineConfig) (EngineResult, error) {
	res := EngineResult{Workload: cfg.Workload, Log: cfg.Log, Threads: cfg.Threads, SyncClients: cfg.SyncClients, DiskLoad: cfg.DiskLoad}
	if err := cfg.validate(); err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "kiroku-bench-engine-*")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ecfg := engineConfig(cfg, dir)
	if cfg.Recovery {
		ecfg.CheckpointInterval = -1 // only the checkpoint after the load: recovery replays the whole run
	}
	ld, err := loadEngine(ctx, cfg, ecfg)
	if err != nil {
		return res, err
	}
	db := ld.db
	defer func() {
		if ld.silos != nil {
			ld.silos.Close()
			return
		}
		if db != nil {
			db.Close()
		}
	}()
	res.LoadSeconds = ld.loadSeconds
	recovery := cfg.Recovery && cfg.Log == "wal"
	if recovery {
		st, err := db.Checkpoint(ctx)
		if err != nil {
			return res, fmt.Errorf("checkpoint: %w", err)
		}
		res.CheckpointSeconds = st.Duration.Seconds()
	}
	var (
		h                  halt
		committed, aborted atomic.Int64
		syncDone           atomic.Int64
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		samples            [][]commitSample
	)
	fail := h.fail
	// stopLoad stops the disk load, if there is one, and returns its error.
	stopLoad := func() error { return nil }
	if cfg.DiskLoad != nil {
		l, err := openDiskLoad(dir, *cfg.DiskLoad)
		if err != nil {
			return res, fmt.Errorf("disk load: %w", err)
		}
		defer l.close() // after stopLoad, deferred below
		halt, done := make(chan struct{}), make(chan error, 1)
		go func() {
			_, err := l.run(halt)
			done <- err
		}()
		stopLoad = sync.OnceValue(func() error { close(halt); return <-done })
	}
	defer stopLoad()
	cpuClock := CPUClock()
	var prof *labelProfile
	if ld.silos != nil {
		// Another profile may be running (kiroku bench --cpuprofile): the
		// split by member is then left out.
		prof, _ = startLabelProfile(replication.MemberLabel)
	}
	cpu0, err := cpuClock()
	if err != nil {
		if prof != nil {
			_, _ = prof.stop()
		}
		return res, err
	}
	io0 := diskWriteBytes()
	var repl0 int64
	if ld.leader != nil {
		repl0 = ld.leader.ProposedBytes()
	}
	start := time.Now()
	syncHist := newHist()
	// client runs transactions until stopped. A sync client waits for each
	// commit to be durable and records begin-to-durable latency; a worker
	// does not wait and samples every 64th commit's epoch and time for
	// the watcher's commit-to-durable latency.
	client := func(id int, sync bool) {
		defer wg.Done()
		r := rand.New(rand.NewPCG(uint64(id), 7))
		tx := db.BeginRaw()
		if !sync {
			if err := tx.Pin(ctx); err != nil {
				fail(err)
				return
			}
			defer tx.Unpin()
		}
		var kr keyer
		hist := newHist()
		var mine []commitSample
		for n := 0; !h.stopped.Load(); n++ {
			var t0 time.Time
			if sync {
				t0 = time.Now()
			}
			e, ok, err := ld.one(ctx, tx, r, &kr)
			if err == nil && ok && sync {
				err = db.WaitDurable(ctx, e)
			}
			if err != nil {
				fail(err)
				return
			}
			if !ok {
				aborted.Add(1)
				continue
			}
			committed.Add(1)
			switch {
			case sync:
				syncDone.Add(1)
				hist.RecordValue(time.Since(t0).Microseconds())
			case n%64 == 0:
				// Sampling every fourth took 1% of the CPU of ycsb-wo
				// (perf), charged to the runs with the log alone.
				mine = append(mine, commitSample{e, int64(time.Since(start))})
			}
		}
		mu.Lock()
		samples = append(samples, mine)
		syncHist.Merge(hist)
		mu.Unlock()
	}
	for w := range cfg.Threads {
		wg.Add(1)
		go client(w, false)
	}
	for c := range cfg.SyncClients {
		wg.Add(1)
		go client(cfg.Threads+c, true)
	}
	// The watcher notes when each epoch became durable, without hurrying
	// the loggers.
	durableAt := map[uint64]int64{}
	var seen atomic.Uint64 // the durable epoch the watcher has recorded
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		d := db.DurableEpoch()
		for {
			if err := db.WatchDurable(watchCtx, d+1); err != nil {
				return
			}
			now := int64(time.Since(start))
			nd := db.DurableEpoch()
			if nd == ^uint64(0) { // no log: durable at commit
				return
			}
			for e := d + 1; e <= nd; e++ {
				durableAt[e] = now
			}
			d = nd
			seen.Store(d)
		}
	}()
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
	}
	h.stopped.Store(true)
	elapsed := time.Since(start)
	io1 := diskWriteBytes()
	var replicated int64
	if ld.leader != nil {
		res.Replicas = cfg.Replicas
		replicated = ld.leader.ProposedBytes() - repl0
	}
	if err := stopLoad(); err != nil {
		fail(fmt.Errorf("disk load: %w", err))
	}
	wg.Wait()
	cpu1, err := cpuClock()
	if err != nil {
		fail(err)
	}
	var byMember map[string]float64
	if prof != nil {
		if byMember, err = prof.stop(); err != nil {
			fail(err)
		}
	}
	res.DiskWriteRate = -1
	if io0 >= 0 && io1 >= 0 {
		res.DiskWriteRate = float64(io1-io0) / elapsed.Seconds()
	}
	if cfg.Log == "wal" {
		res.LogSpan = dirSize(filepath.Join(dir, "log"))
	}
	// Every sampled commit must become durable and be seen by the watcher
	// before it stops: dropping the slowest samples would flatter p99.
	var lastSampled uint64
	for _, ss := range samples {
		for _, x := range ss {
			lastSampled = max(lastSampled, x.epoch)
		}
	}
	if cfg.Log != "none" && h.first() == nil {
		if err := db.WaitDurable(ctx, lastSampled); err != nil {
			fail(err)
		}
		for seen.Load() < lastSampled && ctx.Err() == nil && h.first() == nil {
			time.Sleep(cfg.Epoch / 4)
		}
	}
	stopWatch()
	<-watchDone
	if err := h.first(); err != nil {
		return res, err
	}
	if recovery {
		if err := db.Close(); err != nil {
			return res, err
		}
		res.LogBytes = dirSize(filepath.Join(dir, "log"))
		t0 := time.Now()
		reopened, err := engine.Open(ecfg)
		if err != nil {
			db = nil // closed above; nothing for the deferred Close
			return res, fmt.Errorf("recovery: %w", err)
		}
		db = reopened
		res.RecoverySeconds = time.Since(t0).Seconds()
	}
	res.Seconds = elapsed.Seconds()
	res.Committed, res.Aborted = committed.Load(), aborted.Load()
	res.TxnPerSec = float64(res.Committed) / res.Seconds
	if n := res.Committed + res.Aborted; n > 0 {
		res.AbortRate = float64(res.Aborted) / float64(n)
	}
	res.SyncTxnPerSec = float64(syncDone.Load()) / res.Seconds
	if res.Committed > 0 {
		res.CPUMicros = float64((cpu1 - cpu0).Microseconds()) / float64(res.Committed)
		if byMember != nil {
			res.CPUByMember = map[string]float64{}
			for m, sec := range byMember {
				res.CPUByMember[m] = sec * 1e6 / float64(res.Committed)
			}
			res.Leader = ld.leaderID
		}
		res.ReplicatedBytesPerTxn = float64(replicated) / float64(res.Committed)
	}
	lat := hdrhistogram.New(1, 60_000_000, 3)
	if cfg.Log == "none" {
		lat.RecordValue(0)
	}
	for _, ss := range samples {
		for _, s := range ss {
			if at, ok := durableAt[s.epoch]; ok {
				lat.RecordValue(max(0, (at-s.at)/1000))
			}
		}
	}
	res.DurableSamples = lat.TotalCount()
	res.SyncP50 = float64(syncHist.ValueAtQuantile(50)) / 1000
	res.SyncP99 = float64(syncHist.ValueAtQuantile(99)) / 1000
	res.DurableP50 = float64(lat.ValueAtQuantile(50)) / 1000
	res.DurableP99 = float64(lat.ValueAtQuantile(99)) / 1000
	return res, nil
}

// dirSize is the size of the files in dir (the engine's log directory).
func dirSize(dir string) int64 {
	var n int64
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		if info, err := f.Info(); err == nil && !f.IsDir() {
			n += info.Size()
		}
	}
	return n
}

// halt stops a run's clients and keeps the first error that stopped them.
type halt struct {
	stopped atomic.Bool
	mu      sync.Mutex
	err     error
}

// fail records err, unless an error came first, and stops the run.
func (h *halt) fail(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.err = err
	}
	h.mu.Unlock()
	h.stopped.Store(true)
}

// first is the first error recorded, or nil.
func (h *halt) first() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// engineConfig is the engine's configuration for a run of cfg in dir.
func engineConfig(cfg EngineConfig, dir string) engine.Config {
	// Each of the --threads clients pins a worker, as a Silo thread owns
	// one; sync clients share the rest, as a server's requests do.
	ecfg := engine.Config{Dir: dir, EpochInterval: cfg.Epoch, Workers: cfg.Threads + engine.DefaultWorkers(), LogBufferSize: cfg.LogBuffer,
		LogRoundsInFlight: cfg.RoundsInFlight, CheckpointLogSize: cfg.CheckpointLogSize}
	if cfg.Log == "none" {
		ecfg.Log = engine.LogNone
	}
	return ecfg
}

// loaded is an engine loaded with the benchmark's table.
type loaded struct {
	cfg         EngineConfig
	db          *engine.DB
	silos       *replication.LocalSilos // with Replicas: the group db leads
	leader      *replication.Silo
	leaderID    uint64
	h           *engine.TableHandle
	values      []engine.RawRow // a pool of rows: rows are immutable once written
	loadSeconds float64
}

// keyer holds a client's key bytes. Keys are encoded when used, as a
// server decodes them from a request: a table of a million encoded keys
// would add two cache misses (its entry and the key's bytes) to every
// operation that no server pays. A transaction's keys are encoded into
// one buffer, emptied when the next transaction starts (RawTxn lets its
// caller reuse key bytes once the commit returns): two allocations per
// operation, one for the blob and one for the key, were a sixth of a
// write-only run's CPU.
type keyer struct{ raw, enc []byte }

// loadEngine opens an engine with ecfg, creates the table and loads
// cfg.Records rows, durably. It then collects the garbage of the load,
// as testing.B does before a benchmark: otherwise the collection the load
// leads to falls inside the measured window or not depending on how far
// the load got past the last one, and marking the loaded heap (0.4 s of
// CPU for a million rows) slows the workers of that run alone. The caller
// closes the engine.
func loadEngine(ctx context.Context, cfg EngineConfig, ecfg engine.Config) (*loaded, error) {
	if cfg.Replicas > 0 {
		return loadReplicated(ctx, cfg, ecfg)
	}
	db, err := engine.Open(ecfg)
	if err != nil {
		return nil, err
	}
	ld := &loaded{cfg: cfg, db: db}
	if err := ld.load(ctx); err != nil {
		db.Close()
		return nil, err
	}
	runtime.GC()
	return ld, nil
}

// loadReplicated starts a Raft group of cfg.Replicas+1 members in the
// engine's directory, each with ecfg's engine settings and its Raft log
// on disk, and loads the leader.
func loadReplicated(ctx context.Context, cfg EngineConfig, ecfg engine.Config) (*loaded, error) {
	silos, err := replication.StartLocalSilosWith(cfg.Replicas+1, ecfg.Dir, replication.SiloConfig{Node: replication.Config{PreVote: true, CheckQuorum: true,
		MaxUncommittedEntriesSize: 1 << 30, MaxSizePerMsg: 4 << 20, SegmentSize: 256 << 20}, Engine: ecfg, PersistOnly: cfg.PersistOnly})
	if err != nil {
		return nil, err
	}
	id, leader, err := silos.Leader(20 * time.Second)
	if err != nil {
		silos.Close()
		return nil, err
	}
	ld := &loaded{cfg: cfg, db: leader.DB(), silos: silos, leader: leader, leaderID: id}
	if err := ld.load(ctx); err != nil {
		silos.Close()
		return nil, err
	}
	runtime.GC()
	return ld, nil
}

func (ld *loaded) load(ctx context.Context) error {
	db, cfg := ld.db, ld.cfg
	if err := db.CreateNamespace(ctx, "bench"); err != nil {
		return err
	}
	if err := db.CreateTable(ctx, &storage.Table{Namespace: "bench", Name: "usertable",
		PartitionKey: []storage.Column{{Name: "key", Type: storage.TypeBlob}},
		Columns:      []storage.Column{{Name: "field0", Type: storage.TypeBlob}}}); err != nil {
		return err
	}
	h, err := db.Table("bench", "usertable")
	if err != nil {
		return err
	}
	ld.h = h
	rng := rand.New(rand.NewPCG(1, 2))
	ld.values = make([]engine.RawRow, 1024)
	for i := range ld.values {
		v := make([]byte, cfg.ValueSize)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		ld.values[i] = engine.NewRawRow([]storage.Value{storage.Blob(v)})
	}
	began := time.Now()
	var last uint64
	var kr keyer
	for i := 0; i < cfg.Records; i += 1000 {
		tx := db.BeginRaw()
		kr.enc = kr.enc[:0]
		for j := i; j < min(i+1000, cfg.Records); j++ {
			tx.WriteRow(h, ld.key(&kr, j), ld.values[j%len(ld.values)])
		}
		if last, err = tx.CommitAsync(ctx); err != nil {
			return fmt.Errorf("load: %w", err)
		}
	}
	if err := db.WaitDurable(ctx, last); err != nil {
		return err
	}
	ld.loadSeconds = time.Since(began).Seconds()
	return nil
}

// key encodes row i's key into kr's buffer.
func (ld *loaded) key(kr *keyer, i int) string {
	if kr.raw == nil {
		kr.raw = make([]byte, ld.cfg.KeySize)
	}
	binary.BigEndian.PutUint64(kr.raw, uint64(i))
	n := len(kr.enc)
	kr.enc = ld.h.AppendPartitionKey(kr.enc, storage.BlobString(unsafe.String(&kr.raw[0], len(kr.raw))))
	return unsafe.String(&kr.enc[n], len(kr.enc)-n)
}

// one runs a transaction of the workload on tx; it returns the commit
// epoch and whether it committed (false for a conflict).
func (ld *loaded) one(ctx context.Context, tx *engine.RawTxn, r *rand.Rand, kr *keyer) (uint64, bool, error) {
	cfg, h, values := &ld.cfg, ld.h, ld.values
	tx.Reset()
	kr.enc = kr.enc[:0]
	for range cfg.OpsPerTxn {
		k := ld.key(kr, r.IntN(cfg.Records))
		switch op := r.IntN(2); cfg.Workload {
		case "ycsb-wo":
			tx.WriteRow(h, k, values[r.IntN(len(values))])
		case "ycsb-c":
			tx.Read(h, k)
		case "ycsb-a":
			if op == 0 {
				tx.Read(h, k)
			} else {
				tx.WriteRow(h, k, values[r.IntN(len(values))])
			}
		case "ycsb-f":
			tx.Read(h, k)
			tx.WriteRow(h, k, values[r.IntN(len(values))])
		}
	}
	e, err := tx.CommitAsync(ctx)
	if errors.Is(err, storage.ErrConflict) {
		return 0, false, nil
	}
	return e, err == nil, err
}
