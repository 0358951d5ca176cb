// Package backends is the one registry of kiroku's storage backends: the
// server, the Validator's command and the benchmarks open a backend by
// name through it, and a new backend is added here once.
package backends

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/storage/coordinator"
	"github.com/kiroku-db/kiroku/storage/postgres"
)

// Config is what opening a backend may need; each backend reads its own
// fields and refuses to open without the ones it requires.
type Config struct {
	// Dir is the embedded engine's directory.
	Dir string
	// Engine tunes the embedded engine; its Dir is set from Dir.
	Engine engine.Config
	// DSN is PostgreSQL's connection string.
	DSN string
	// MaxConns bounds PostgreSQL's connection pool; 0 takes its default.
	MaxConns int
	// Contacts are Cassandra's contact points, comma-separated, each host
	// or host:port.
	Contacts string
	// Keyspace is the Cassandra keyspace kiroku keeps its tables in; ""
	// takes its default.
	Keyspace string
	// Consistency, SerialConsistency and LocalDC are Cassandra's
	// consistency of writes and quorum reads ("QUORUM", "LOCAL_QUORUM",
	// ...), of its Paxos rounds ("SERIAL" or "LOCAL_SERIAL") and the
	// datacenter whose nodes the driver prefers; "" takes the cassandra
	// package's defaults (see cassandra.Config).
	Consistency, SerialConsistency, LocalDC string
}

// ErrConfig is the cause of a backend that cannot open with the Config
// given, or of a name that is no backend's.
var ErrConfig = errors.New("backends: bad configuration")

// backend is one registered backend. open's coordinated says that a
// store without transactions of its own will be used only through
// storage/coordinator's (Open), which may let it read more cheaply.
type backend struct {
	name string
	help string
	open func(ctx context.Context, c Config, coordinated bool) (storage.Store, error)
}

var registry = []backend{
	{name: "engine", help: "the embedded engine, in Dir", open: func(_ context.Context, c Config, _ bool) (storage.Store, error) {
		if c.Dir == "" {
			return nil, fmt.Errorf("%w: the engine needs a directory", ErrConfig)
		}
		ec := c.Engine
		ec.Dir = c.Dir
		// Through a typed local: a failed Open's nil *engine.DB must not
		// become a non-nil storage.Store.
		db, err := engine.Open(ec)
		if err != nil {
			return nil, err
		}
		return db, nil
	}},
	{name: "postgres", help: "PostgreSQL at DSN", open: func(ctx context.Context, c Config, _ bool) (storage.Store, error) {
		if c.DSN == "" {
			return nil, fmt.Errorf("%w: postgres needs a DSN", ErrConfig)
		}
		db, err := postgres.Open(ctx, postgres.Config{DSN: c.DSN, MaxConns: int32(c.MaxConns)})
		if err != nil {
			return nil, err
		}
		return db, nil
	}},
	// A Store without transactions: Open gives it the coordinator's.
	{name: "cassandra", help: "Apache Cassandra at Contacts, in Keyspace; transactions by storage/coordinator", open: func(ctx context.Context, c Config, coordinated bool) (storage.Store, error) {
		var contacts []string
		for _, h := range strings.Split(c.Contacts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				contacts = append(contacts, h)
			}
		}
		if len(contacts) == 0 {
			return nil, fmt.Errorf("%w: cassandra needs contact points", ErrConfig)
		}
		cc := cassandra.Config{Contacts: contacts, Keyspace: c.Keyspace,
			Consistency: c.Consistency, SerialConsistency: c.SerialConsistency, LocalDC: c.LocalDC}
		if coordinated {
			// The coordinator's reads need to see every write that
			// returned before they began, and no more (its package doc):
			// quorum reads do, every write being a lightweight
			// transaction committed at that quorum, without a Paxos round.
			cc.ReadConsistency = "QUORUM"
			if c.Consistency == "LOCAL_QUORUM" {
				cc.ReadConsistency = "LOCAL_QUORUM"
			}
		}
		if err := cc.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		db, err := cassandra.Open(ctx, cc)
		if err != nil {
			return nil, err
		}
		return db, nil
	}},
}

// Names lists the registered backends.
func Names() []string {
	var out []string
	for _, b := range registry {
		out = append(out, b.name)
	}
	return out
}

// Help describes the registered backends in one line, for flags.
func Help() string {
	var out []string
	for _, b := range registry {
		out = append(out, b.name+" ("+b.help+")")
	}
	return strings.Join(out, ", ")
}

// OpenStore opens backend name as a Store.
func OpenStore(ctx context.Context, name string, c Config) (storage.Store, error) {
	return openStore(ctx, name, c, false)
}

func openStore(ctx context.Context, name string, c Config, coordinated bool) (storage.Store, error) {
	i := slices.IndexFunc(registry, func(b backend) bool { return b.name == name })
	if i < 0 {
		return nil, fmt.Errorf("%w: no backend %q (have %s)", ErrConfig, name, strings.Join(Names(), ", "))
	}
	return registry[i].open(ctx, c, coordinated)
}

// Open opens backend name as a Backend, a Store with transactions: its
// own, or, for a store without (Cassandra), those of storage/coordinator
// over it.
func Open(ctx context.Context, name string, c Config) (storage.Backend, error) {
	s, err := openStore(ctx, name, c, true)
	if err != nil {
		return nil, err
	}
	if b, ok := s.(storage.Backend); ok {
		return b, nil
	}
	b, err := coordinator.Open(ctx, s, coordinator.Config{})
	if err != nil {
		s.Close()
		return nil, err
	}
	return b, nil
}
