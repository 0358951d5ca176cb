package wal

import (
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
)

// PolicyKind names a sync policy.
type PolicyKind uint8

const (
	// Batch: every append waits for an fsync; the syncer starts one as soon
	// as records are pending, so the records that queue up while an fsync
	// runs share the next one.
	Batch PolicyKind = iota + 1
	// Group: appends wait; the syncer fsyncs once per Window, on a fixed
	// cadence, covering everything written before the round began (seed 003,
	// Cassandra's commitlog_sync: group).
	Group
	// Count: the syncer fsyncs once Count records are pending or the oldest
	// pending record has waited MaxWait, whichever comes first (seed 001,
	// Algorithm 1).
	Count
	// Periodic: an append is acknowledged as soon as it is written to the
	// operating system, and the syncer fsyncs every Interval. ACKNOWLEDGED
	// RECORDS CAN BE LOST on a power failure or kernel crash: up to Interval
	// of them, plus the fsync in flight. (They survive a crash of the
	// process alone.) This is Cassandra's default; never use it for data
	// that must not be lost.
	Periodic
)

func (k PolicyKind) String() string {
	switch k {
	case Batch:
		return "batch"
	case Group:
		return "group"
	case Count:
		return "count"
	case Periodic:
		return "periodic"
	}
	return fmt.Sprintf("PolicyKind(%d)", uint8(k))
}

// Policy is a sync policy with its parameters.
type Policy struct {
	Kind PolicyKind
	// Window is Group's fsync cadence. Required for Group (> 0).
	Window time.Duration
	// Count is Count's record threshold. Required for Count (> 0).
	Count int
	// MaxWait is the longest a record waits under Count. Required for Count.
	MaxWait time.Duration
	// Interval is Periodic's fsync cadence. Required for Periodic.
	Interval time.Duration
}

// Policy constructors.
func BatchPolicy() Policy                       { return Policy{Kind: Batch} }
func GroupPolicy(window time.Duration) Policy   { return Policy{Kind: Group, Window: window} }
func PeriodicPolicy(every time.Duration) Policy { return Policy{Kind: Periodic, Interval: every} }
func CountPolicy(n int, maxWait time.Duration) Policy {
	return Policy{Kind: Count, Count: n, MaxWait: maxWait}
}

func (p Policy) String() string {
	switch p.Kind {
	case Group:
		return fmt.Sprintf("group(%v)", p.Window)
	case Count:
		return fmt.Sprintf("count(%d, %v)", p.Count, p.MaxWait)
	case Periodic:
		return fmt.Sprintf("periodic(%v)", p.Interval)
	}
	return p.Kind.String()
}

func (p Policy) validate() error {
	switch p.Kind {
	case Batch:
		return nil
	case Group:
		if p.Window <= 0 {
			return errors.New("wal: group policy needs a window > 0")
		}
	case Count:
		if p.Count <= 0 || p.MaxWait <= 0 {
			return errors.New("wal: count policy needs a count > 0 and a max wait > 0")
		}
	case Periodic:
		if p.Interval <= 0 {
			return errors.New("wal: periodic policy needs an interval > 0")
		}
	default:
		return fmt.Errorf("wal: unknown sync policy %v", p.Kind)
	}
	return nil
}

// Config configures a Log.
type Config struct {
	// Dir is the log's directory; it is created if missing. Required.
	Dir string
	// FS is the filesystem; nil means the operating system's (vfs.Default).
	FS vfs.FS
	// Policy is the sync policy. Required.
	Policy Policy
	// SegmentSize is the size in bytes each segment file is preallocated
	// to; a record that does not fit in what is left starts the next
	// segment. 0 means 64 MiB.
	SegmentSize int64
	// MaxRecordSize bounds one record's payload in bytes. 0 means 16 MiB,
	// capped to fit a segment.
	MaxRecordSize int
	// MaxPending bounds the bytes appended but not yet written to the
	// file; Append blocks (backpressure) while it is exceeded. 0 means
	// 64 MiB; it is raised to hold at least one record of MaxRecordSize.
	MaxPending int
	// RecycleSegments is how many segments removed by TruncateFront are
	// kept, under temporary names, to become later segments: the preparer
	// overwrites one with zeros instead of creating a file. Overwriting a
	// file whose pages are cached costs a copy; a new file needs fresh
	// page-cache pages, which on this project's virtual machines cost about
	// ten times as much to touch (with direct I/O, the default, neither
	// touches the page cache), and its blocks must be allocated. Kept
	// files hold disk space the log has already used once; they are
	// removed at the next Open. 0 removes every truncated segment.
	RecycleSegments int
	// BufferedIO writes segments through the page cache. By default the
	// log writes them with direct I/O where the filesystem takes it and
	// SegmentSize is a multiple of 4 KiB: a write then goes from the log's
	// buffer to the device, and fdatasync flushes the device's cache. The
	// page cache would cost the kernel a copy of every byte (the
	// preparer's zeros too), memory that is never read again, and cache
	// lines the appenders' work then misses on.
	BufferedIO bool
	// Clock is the log's only source of time: the sync policies' windows,
	// waits and intervals are read and waited on through it. nil means the
	// real clock, and then the syncer sleeps the last stretch of a short
	// wait precisely (sleep_linux.go: Go's timers can be a millisecond
	// late, longer than a group window). With any other clock, such as a
	// clockwork.FakeClock driving a deterministic simulation, every wait is
	// a timer of that clock, and the syncer acts only when the clock is
	// advanced past it. Only the syncer's waits use the clock: fsyncs and
	// other I/O take what they take.
	Clock clockwork.Clock
	// Logf reports recovery events (a torn tail truncated); nil discards.
	Logf func(format string, args ...any)
}

// preciseClock reports whether c is the real clock, for which the syncer
// keeps its precise sleep.
func preciseClock(c clockwork.Clock) bool {
	return c == nil || reflect.TypeOf(c) == reflect.TypeOf(clockwork.NewRealClock())
}

func (c *Config) validate() error {
	if c.Dir == "" {
		return errors.New("wal: Config.Dir is empty")
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if err := c.Policy.validate(); err != nil {
		return err
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 64 << 20
	}
	if c.SegmentSize < 4096 || c.SegmentSize > 1<<31 {
		return fmt.Errorf("wal: SegmentSize %d outside 4 KiB..2 GiB", c.SegmentSize)
	}
	if c.MaxRecordSize == 0 {
		c.MaxRecordSize = 16 << 20
	}
	c.MaxRecordSize = min(c.MaxRecordSize, int(c.SegmentSize)-headerSize)
	if c.MaxRecordSize <= 0 {
		return fmt.Errorf("wal: MaxRecordSize %d must be > 0", c.MaxRecordSize)
	}
	if c.MaxPending == 0 {
		c.MaxPending = 64 << 20
	}
	if c.MaxPending < 0 {
		return errors.New("wal: negative MaxPending")
	}
	c.MaxPending = max(c.MaxPending, frameSize(c.MaxRecordSize))
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	return nil
}
