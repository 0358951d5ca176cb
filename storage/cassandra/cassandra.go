// Package cassandra is the Apache Cassandra backend of the storage API: a
// storage.Store (schemas and the single-partition operations), without
// transactions of its own — a generic coordinator over a Store provides
// those. It runs on the Apache driver, github.com/apache/cassandra-gocql-driver/v2,
// and is tested against Cassandra 5.0.
//
// # Layout
//
// Everything lives in one keyspace (Config.Keyspace, "kiroku" by default),
// created by Open with NetworkTopologyStrategy and Config.ReplicationFactor.
// A kiroku namespace is not a keyspace but a row of the catalog table,
// kiroku_catalog, in that keyspace; a kiroku table is one CQL table named
// after its namespace and name (cut to 12 bytes each) and 16 random hex
// digits, e.g. ledger_assets_9f3a0c2b1e4d5a67. One keyspace rather than one
// per namespace because: Cassandra names are at most 48 characters, which
// a kiroku namespace may already use up, leaving no room to keep kiroku's
// keyspaces apart from others; creating or dropping a namespace is then a
// catalog write, not a schema change (slow in Cassandra, and unsafe to run
// concurrently before 5.1's transactional metadata); replication is set
// once; and, above all, the catalog can check a namespace and its tables
// atomically with the write that changes them (below). The random part
// makes a table dropped and created again by another process a different
// CQL table, so a stale cached schema meets "unconfigured table" (mapped to
// storage.ErrConflict, after which the single operation reloads the
// schema and judges its request again) instead of writing by the old
// definition.
//
// The catalog is one Cassandra partition whose rows are the layout version,
// the namespaces and the tables (their schema as JSON, the CQL table's name
// and id, and a state). Every catalog write is a lightweight transaction
// on that partition and every catalog read is at SERIAL consistency, so
// DDL from any number of processes is linearizable: CreateTable inserts
// its row and touches its namespace's row in one conditional batch (the
// namespace must exist), DropNamespace deletes the namespace's row only if
// no CreateTable touched it since it saw the namespace empty. A table's
// DDL rolls forward: its catalog row is written first (state creating),
// then CREATE TABLE with the row's table id (WITH ID, so two processes
// finishing the same creation make one table), then the state becomes
// ready; DropTable marks it dropping, drops the CQL table, and deletes the
// row. Any process that finds a table creating or dropping (a process died
// half way) finishes the job. Each schema change waits for schema agreement.
//
// # Types
//
// BOOLEAN, BIGINT, DOUBLE, TEXT and BLOB are CQL boolean, bigint, double,
// text and blob; TIMESTAMP is bigint microseconds since the Unix epoch
// (CQL's timestamp has milliseconds, kiroku microseconds). A TEXT or BLOB
// partition-key column is a CQL blob holding a 0x00 byte and then the
// value, because Cassandra refuses an empty partition key and kiroku does
// not; clustering and value columns hold TEXT and BLOB as they are, empty
// included. NULL is Cassandra's null (no cell), distinct from empty. The
// orders agree with kiroku's: text and blob compare bytewise (code point
// order for UTF-8), bigint signed, boolean false before true. DOUBLE is
// never a key, so its order matters only in conditions: Cassandra's double
// comparison is Java's Double.compare — NaN equals NaN and exceeds +Inf,
// as in kiroku, but -0 is below +0 where kiroku has them equal — so a
// comparison with a zero operand is rewritten to treat both zeros alike
// (see expr). Values are stored bit-exact, -0 and NaN included. The bytes
// are written and read by this package (codec.go), which rejects a stored
// value the storage API would not accept.
//
// Every table has one hidden column, "_exists", which every put sets to
// true: Cassandra keeps a row only while one of its cells lives, and a row
// of NULLs that kiroku keeps would otherwise vanish.
//
// # Operations and consistency
//
// Every write is a lightweight transaction (Paxos) at the serial
// consistency Config.SerialConsistency, committed at Config.Consistency: a
// conditional Put or Delete carries its condition (IF "_exists" = null for
// IfNotExists, = true for IfExists, that and the expressions for If), and
// an unconditional one the condition "_exists" IN (null, true), which
// always holds. Cassandra orders plain writes by their timestamps and
// Paxos writes by ballots; mixed on the same rows, a plain write can be
// ordered before a Paxos write that it followed in real time (or lose to
// one with a later clock), which would break each call's linearizability.
// With Paxos for every write, each partition's writes form one linearizable
// sequence, at the price of four round trips per write (Paxos v1; v2, set
// by paxos_variant, needs fewer). Reads are at Config.ReadConsistency,
// SERIAL by default: a SERIAL read completes any Paxos round in progress
// before it answers, so a Get or a Scan sees every write that returned
// before it began, and nothing that may yet be undone. QUORUM reads are
// cheaper and, with every write a Paxos write, see every write that
// returned before they began; but a write whose Paxos round was cut short
// (its caller saw ErrCommitUnknown) can be missed by one QUORUM read and
// then completed and seen by a later one. That is all storage/coordinator
// needs of its reads (see its package doc), so storage/backends opens the
// store it puts the coordinator over with QUORUM reads.
//
// Stats counts the requests sent: round trips, lightweight transactions
// and SERIAL reads, for benchmarks to report what an operation costs.
//
// A comparison with a NULL column is false in kiroku; Cassandra's col <> v
// holds on NULL, so <> also requires col <> null. Conditions on key columns,
// which Cassandra refuses in an IF clause, are evaluated here on the
// request's own key values. Mutate is one conditional batch on the
// partition: every condition holds and everything is written, or nothing
// is; when one fails, the current rows that Cassandra returns with the
// verdict tell which mutation's condition did not hold, and the error says
// so. A batch applies its statements with one timestamp and checks every
// condition against the rows as they were before it, so mutations of the
// same row are folded into one statement with their combined effect, and a
// condition on a row that an earlier mutation of the same Mutate writes is
// refused (ErrInvalidArgument). A Skippable put whose condition fails in a
// Mutate is replaced by a guard that the row is still as it was (so that
// the skip and the rest of the batch are atomic together) and the batch is
// sent again; such a put must be the only mutation of its row.
//
// A Scan is one CQL query in the partition: a bound whose clustering
// columns share one direction is a multi-column slice; a bound that mixes
// ASC and DESC columns is sent as the slice of its leading same-direction
// columns and the rows beyond it at that edge are filtered here (see
// scanPlan) — never split into several queries, which would make the scan
// see some of a concurrent Mutate's rows and not others. A scan is atomic
// as long as its rows (and filtered edge rows) fit in one page
// (Config.PageSize); a longer one reads page by page, each page atomic.
//
// # Limits
//
// Cassandra refuses a request larger than native_transport_max_frame_size
// and a mutation larger than max_mutation_size (half of
// commitlog_segment_size), both 16 MiB by default (Config.MaxRequestSize).
// Each carries a write's keys and values plus overhead per row and cell,
// which kiroku's sizes do not count, so Limits.MaxWriteSize defaults to,
// and is at most, half of MaxRequestSize (8 MiB by default); a Mutate,
// one request and one mutation, is held to it as a whole. Keys are far
// below Cassandra's 64 KiB per key column.
//
// # Errors
//
// A coordinator that reports too few replicas (Unavailable, Overloaded,
// Bootstrapping) or a failed connection before sending gives
// storage.ErrUnavailable; a write whose outcome the coordinator could not
// learn (a write timeout, CAS_WRITE_UNKNOWN, a connection reset or
// closed after sending, the caller's context ending mid-write) gives
// storage.ErrCommitUnknown, never retried; a read that times out gives
// ErrUnavailable. A table that another process dropped gives ErrConflict,
// retried internally after reloading the schema.
package cassandra

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/kiroku-db/kiroku/storage"
)

// Config configures a DB. Zero fields take the defaults given.
type Config struct {
	// Contacts are the nodes the driver first connects to, "host" or
	// "host:port"; it discovers the rest of the cluster from them.
	// Required.
	Contacts []string
	// Port is the CQL native port of every node: the driver dials the
	// nodes it discovers on it. 0 means the port the contacts name (they
	// must agree), or 9042 if none does.
	Port int
	// Keyspace holds the catalog and every table; Open creates it if it is
	// missing. "" means "kiroku". 1–48 characters of [a-z0-9_], starting
	// with a letter.
	Keyspace string
	// ReplicationFactor is the replication of a keyspace Open creates (an
	// existing keyspace keeps its own). 0 means min(3, the nodes the
	// driver sees).
	ReplicationFactor int
	// Consistency is the consistency of the commit of every write (and of
	// reads when ReadConsistency says so): "QUORUM" (the default) or
	// "LOCAL_QUORUM", "EACH_QUORUM" or "ALL".
	Consistency string
	// SerialConsistency is the consistency of the Paxos round of every
	// write and of the catalog's reads: "SERIAL" (the default) or
	// "LOCAL_SERIAL" (linearizable within one datacenter only).
	SerialConsistency string
	// ReadConsistency is the consistency of Get and Scan: "" means
	// SerialConsistency (linearizable); "QUORUM" or "LOCAL_QUORUM" are
	// cheaper, with the caveat in the package doc.
	ReadConsistency string
	// LocalDC, if set, makes the driver prefer the nodes of that
	// datacenter.
	LocalDC string
	// Timeout bounds each request on the client side; 0 means 12s, above
	// Cassandra's own cas_contention_timeout plus write_request_timeout, so
	// that the server's verdict (a timeout it reports) arrives first.
	Timeout time.Duration
	// ConnectTimeout bounds each connection attempt; 0 means 5s.
	ConnectTimeout time.Duration
	// SchemaTimeout bounds the wait for schema agreement after a schema
	// change; 0 means 30s.
	SchemaTimeout time.Duration
	// NumConns is the number of connections per node; 0 means 2.
	NumConns int
	// PageSize is the number of rows a scan reads per round trip; 0 means
	// 5000. A scan is atomic within a page.
	PageSize int
	// OpRetries is how many times a single operation is tried when the
	// table it uses was replaced by another process (ErrConflict); 0 means 5.
	OpRetries int
	// MaxRequestSize is the smaller of the servers' native_transport_max_
	// frame_size and max_mutation_size (half of commitlog_segment_size), in
	// bytes; 0 means 16 MiB, both of their defaults.
	MaxRequestSize int
	// Limits are the storage size limits; zero fields take the defaults,
	// except MaxWriteSize, which defaults to MaxRequestSize/2 and may not
	// exceed it.
	Limits storage.Limits

	consistency, serial, read gocql.Consistency
}

// Validate fills defaults and rejects bad settings.
func (c *Config) Validate() error {
	if len(c.Contacts) == 0 {
		return errors.New("cassandra: Config.Contacts is empty")
	}
	port := 0
	for _, h := range c.Contacts {
		host, p, err := splitHostPort(h)
		if err != nil || host == "" {
			return fmt.Errorf("cassandra: contact %q: want host or host:port", h)
		}
		if p != 0 && port != 0 && p != port {
			return fmt.Errorf("cassandra: contacts name ports %d and %d; every node must listen on one port", port, p)
		}
		if p != 0 {
			port = p
		}
	}
	switch {
	case c.Port == 0 && port != 0:
		c.Port = port
	case c.Port == 0:
		c.Port = 9042
	case port != 0 && port != c.Port:
		return fmt.Errorf("cassandra: contacts name port %d, Port is %d", port, c.Port)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("cassandra: Port %d", c.Port)
	}
	if c.Keyspace == "" {
		c.Keyspace = "kiroku"
	}
	if err := storage.CheckName("keyspace", c.Keyspace); err != nil {
		return fmt.Errorf("cassandra: Keyspace: %w", err)
	}
	if c.ReplicationFactor < 0 || c.NumConns < 0 || c.PageSize < 0 || c.OpRetries < 0 || c.MaxRequestSize < 0 ||
		c.Timeout < 0 || c.ConnectTimeout < 0 || c.SchemaTimeout < 0 {
		return errors.New("cassandra: negative setting in Config")
	}
	var err error
	if c.consistency, err = parseConsistency("Consistency", c.Consistency, "QUORUM", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"); err != nil {
		return err
	}
	if c.serial, err = parseConsistency("SerialConsistency", c.SerialConsistency, "SERIAL", "SERIAL", "LOCAL_SERIAL"); err != nil {
		return err
	}
	if c.read, err = parseConsistency("ReadConsistency", c.ReadConsistency, c.serial.String(), "SERIAL", "LOCAL_SERIAL", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"); err != nil {
		return err
	}
	if c.Timeout == 0 {
		c.Timeout = 12 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.SchemaTimeout == 0 {
		c.SchemaTimeout = 30 * time.Second
	}
	if c.NumConns == 0 {
		c.NumConns = 2
	}
	if c.PageSize == 0 {
		c.PageSize = 5000
	}
	if c.OpRetries == 0 {
		c.OpRetries = 5
	}
	if c.MaxRequestSize == 0 {
		c.MaxRequestSize = 16 << 20
	}
	if c.Limits.MaxWriteSize == 0 {
		c.Limits.MaxWriteSize = c.MaxRequestSize / 2
	}
	lim, err := c.Limits.WithDefaults()
	if err != nil {
		return fmt.Errorf("cassandra: %w", err)
	}
	if lim.MaxWriteSize > c.MaxRequestSize/2 {
		return fmt.Errorf("cassandra: Limits.MaxWriteSize %d is over half of MaxRequestSize %d, the room a request needs for its overhead", lim.MaxWriteSize, c.MaxRequestSize)
	}
	c.Limits = lim
	return nil
}

func parseConsistency(field, s, def string, allowed ...string) (gocql.Consistency, error) {
	if s == "" {
		s = def
	}
	s = strings.ToUpper(s)
	for _, a := range allowed {
		if s == a {
			var c gocql.Consistency
			err := c.UnmarshalText([]byte(s))
			return c, err
		}
	}
	return 0, fmt.Errorf("cassandra: %s %q: want one of %s", field, s, strings.Join(allowed, ", "))
}

// splitHostPort splits "host" or "host:port" (IPv6 in brackets); port 0
// when there is none.
func splitHostPort(s string) (string, int, error) {
	if !strings.Contains(s, ":") || strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		return strings.Trim(s, "[]"), 0, nil
	}
	if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") { // a bare IPv6 address
		return s, 0, nil
	}
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// DB is a storage.Store on Cassandra. It is safe for concurrent use.
type DB struct {
	session *gocql.Session
	cfg     Config
	ks      string // the keyspace, quoted
	catalog string // the catalog table, qualified and quoted
	closed  atomic.Bool
	stats   *counters // the session's observer: Stats

	mu struct {
		sync.RWMutex
		tables map[string]*relTable // "ns.table" → schema and CQL table
	}
}

var _ storage.Store = (*DB)(nil)

// catalogVersion is the layout of the catalog this build reads.
const catalogVersion = 1

// Open connects to Cassandra and creates the keyspace and the catalog if
// they are missing. A cluster that cannot be reached gives
// storage.ErrUnavailable.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hosts := make([]string, len(cfg.Contacts))
	for i, h := range cfg.Contacts {
		hosts[i], _, _ = splitHostPort(h)
	}
	cl := gocql.NewCluster(hosts...)
	cl.Port = cfg.Port
	cl.Timeout = cfg.Timeout
	cl.ConnectTimeout = cfg.ConnectTimeout
	cl.MaxWaitSchemaAgreement = cfg.SchemaTimeout
	cl.NumConns = cfg.NumConns
	cl.PageSize = cfg.PageSize
	cl.Consistency = cfg.consistency
	cl.SerialConsistency = cfg.serial
	// Keyspace metadata (replication) is what token-aware routing needs;
	// tables are kiroku's to know.
	cl.Metadata.CacheMode = gocql.KeyspaceOnly
	fallback := gocql.RoundRobinHostPolicy()
	if cfg.LocalDC != "" {
		fallback = gocql.DCAwareRoundRobinPolicy(cfg.LocalDC)
	}
	cl.PoolConfig.HostSelectionPolicy = gocql.TokenAwareHostPolicy(fallback)
	stats := &counters{}
	cl.QueryObserver, cl.BatchObserver = stats, stats
	session, err := connect(ctx, cl)
	if err != nil {
		return nil, err
	}
	db := &DB{session: session, cfg: cfg, ks: ident(cfg.Keyspace), catalog: ident(cfg.Keyspace) + ".kiroku_catalog", stats: stats}
	db.mu.tables = map[string]*relTable{}
	if err := db.bootstrap(ctx); err != nil {
		session.Close()
		return nil, err
	}
	return db, nil
}

// connect creates the session. The driver takes no context for this: the
// time is bounded by ConnectTimeout per contact, and ctx is checked first.
func connect(ctx context.Context, cl *gocql.ClusterConfig) (*gocql.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cassandra: open: %w", err)
	}
	s, err := cl.CreateSession()
	if err != nil {
		return nil, &storage.Error{Kind: storage.ErrUnavailable, Op: "open", Detail: "cannot connect to Cassandra", Cause: err}
	}
	return s, nil
}

// bootstrap creates the keyspace and the catalog if they are missing and
// checks the catalog's layout version.
func (db *DB) bootstrap(ctx context.Context) error {
	const op = "open"
	var n int
	err := db.session.Query(`SELECT count(*) FROM system_schema.keyspaces WHERE keyspace_name = ?`, db.cfg.Keyspace).
		Consistency(gocql.One).ScanContext(ctx, &n)
	if err != nil {
		return mapErr(op, "", "", err, false)
	}
	if n == 0 {
		rf := db.cfg.ReplicationFactor
		if rf == 0 {
			rf = min(3, max(1, len(db.session.GetHosts())))
		}
		q := fmt.Sprintf(`CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': 'NetworkTopologyStrategy', 'replication_factor': %d}`, db.ks, rf)
		if err := db.ddl(ctx, op, q); err != nil {
			return err
		}
	}
	// The catalog's id is derived from the keyspace, so that processes
	// creating it at once make one table.
	q := `CREATE TABLE IF NOT EXISTS ` + db.catalog + ` (part int, namespace text, name text,
		version int, gen uuid, state text, relation text, id uuid, definition text,
		PRIMARY KEY (part, namespace, name)) WITH ID = ` + derivedUUID("kiroku catalog "+db.cfg.Keyspace) +
		` AND comment = 'kiroku catalog: namespaces and tables'`
	if err := db.ddl(ctx, op, q); err != nil {
		return err
	}
	applied, row, err := db.catalogCAS(ctx, op,
		`UPDATE `+db.catalog+` SET version = ? WHERE part = 0 AND namespace = '' AND name = '' IF version = null`, catalogVersion)
	if err != nil {
		return err
	}
	if !applied {
		if v, _ := row["version"].(int); v != catalogVersion {
			return fmt.Errorf("cassandra: keyspace %s holds a kiroku catalog of version %v; this build reads version %d", db.cfg.Keyspace, row["version"], catalogVersion)
		}
	}
	return nil
}

// derivedUUID is a version-8 (custom) UUID made from a hash of s.
func derivedUUID(s string) string {
	h := sha256.Sum256([]byte(s))
	h[6] = h[6]&0x0f | 0x80
	h[8] = h[8]&0x3f | 0x80
	u, _ := gocql.UUIDFromBytes(h[:16])
	return u.String()
}

// ddl runs a schema change and waits until every node agrees on the schema.
func (db *DB) ddl(ctx context.Context, op, q string) error {
	if err := db.session.Query(q).ExecContext(ctx); err != nil {
		return mapErr(op, "", "", err, true)
	}
	if err := db.session.AwaitSchemaAgreement(ctx); err != nil {
		return mapErr(op, "", "", err, true)
	}
	return nil
}

// Limits implements storage.Store.
func (db *DB) Limits() storage.Limits { return db.cfg.Limits }

// Close closes the session.
func (db *DB) Close() error {
	if db.closed.CompareAndSwap(false, true) {
		db.session.Close()
	}
	return nil
}

func (db *DB) checkOpen(op string) error {
	if db.closed.Load() {
		return &storage.Error{Kind: storage.ErrClosed, Op: op}
	}
	return nil
}

// retry runs fn until it does not return ErrConflict, at most OpRetries
// times. A conflict here is a table replaced by another process, which fn
// notices and reloads: no backoff is needed.
func (db *DB) retry(fn func() error) error {
	var err error
	for attempt := 0; attempt < db.cfg.OpRetries; attempt++ {
		if err = fn(); err == nil || !errors.Is(err, storage.ErrConflict) {
			return err
		}
	}
	return err
}

// mapErr turns a driver error into a storage error. write says whether the
// failed call could have written something on its own: a failure after the
// request may have reached the coordinator then leaves the outcome unknown.
func mapErr(op, ns, table string, err error, write bool) error {
	if err == nil {
		return nil
	}
	var se *storage.Error
	if errors.As(err, &se) {
		return err
	}
	e := &storage.Error{Op: op, Namespace: ns, Table: table, Cause: err}
	unknown := func() error {
		if write {
			e.Kind = storage.ErrCommitUnknown
		} else {
			e.Kind = storage.ErrUnavailable
		}
		return e
	}
	var (
		unavailable  *gocql.RequestErrUnavailable
		overloaded   *gocql.RequestErrOverloaded
		bootstrap    *gocql.RequestErrBootstrapping
		writeTimeout *gocql.RequestErrWriteTimeout
		writeFailure *gocql.RequestErrWriteFailure
		casUnknown   *gocql.RequestErrCASWriteUnknown
		readTimeout  *gocql.RequestErrReadTimeout
		readFailure  *gocql.RequestErrReadFailure
		invalid      *gocql.RequestErrInvalid
		netErr       net.Error
		opErr        *net.OpError
	)
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if write {
			e.Kind = storage.ErrCommitUnknown
			return e
		}
		return fmt.Errorf("storage: %s: %w", op, err)
	case errors.Is(err, gocql.ErrSessionClosed):
		e.Kind = storage.ErrClosed
	case errors.Is(err, gocql.ErrNoConnections), errors.Is(err, gocql.ErrNoConnectionsStarted), errors.Is(err, gocql.ErrNoStreams),
		errors.As(err, &unavailable), errors.As(err, &overloaded), errors.As(err, &bootstrap),
		errors.As(err, &opErr) && opErr.Op == "dial":
		// Refused before anything was done.
		e.Kind = storage.ErrUnavailable
	case errors.As(err, &writeTimeout), errors.As(err, &writeFailure), errors.As(err, &casUnknown),
		errors.As(err, &readTimeout), errors.As(err, &readFailure),
		errors.Is(err, gocql.ErrTimeoutNoResponse), errors.Is(err, gocql.ErrConnectionClosed), errors.As(err, &netErr),
		// The connection closed (FIN) while the driver read a reply: the
		// driver reports the EOF it met, wrapped.
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return unknown()
	case errors.As(err, &invalid):
		msg := invalid.Message()
		switch {
		case strings.Contains(msg, "unconfigured table") || strings.Contains(msg, "does not exist"):
			// The cached schema names a CQL table that is gone: another
			// process dropped (and perhaps recreated) the kiroku table.
			e.Kind = storage.ErrConflict
			e.Detail = "the table was dropped or replaced by another process"
		case tooLarge(msg):
			e.Kind = storage.ErrTooLarge
		default:
			return fmt.Errorf("storage: %s: cassandra: %w", op, err)
		}
	default:
		if tooLarge(err.Error()) {
			e.Kind = storage.ErrTooLarge
			return e
		}
		return fmt.Errorf("storage: %s: cassandra: %w", op, err)
	}
	return e
}

// tooLarge recognizes Cassandra's refusals of a request over its sizes,
// made before the request runs: "CQL Message of size ... exceeds allowed
// maximum" (native_transport_max_frame_size) and "Mutation ... is too
// large" (max_mutation_size).
func tooLarge(msg string) bool {
	return strings.Contains(msg, "exceeds allowed maximum") || strings.Contains(msg, "too large")
}
