package backends

import (
	"context"
	"errors"
	"testing"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

// TestOpen: a registered backend opens by name; a name that is no
// backend's, or a backend without what it needs, is ErrConfig.
func TestOpen(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		cfg  Config
	}{{"nope", Config{Dir: t.TempDir()}}, {"engine", Config{}}, {"postgres", Config{}}, {"cassandra", Config{}}} {
		if _, err := Open(ctx, c.name, c.cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("Open(%q, %+v): %v, want ErrConfig", c.name, c.cfg, err)
		}
	}
	b, err := Open(ctx, "engine", Config{Dir: t.TempDir(), Engine: engine.Config{Log: engine.LogNone}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*engine.DB); !ok {
		t.Fatalf("the engine backend is a %T", b)
	}
	if err := b.CreateNamespace(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	var _ storage.Backend = b
	if got := Names(); len(got) < 2 || got[0] != "engine" {
		t.Fatalf("Names() = %v", got)
	}
}

// TestCassandraSettings: a consistency the backend does not keep its
// guarantees with is refused before any connection is tried.
func TestCassandraSettings(t *testing.T) {
	for _, c := range []Config{{Contacts: "127.0.0.1:1", Consistency: "ONE"}, {Contacts: "127.0.0.1:1", SerialConsistency: "QUORUM"}} {
		_, err := Open(context.Background(), "cassandra", c)
		if !errors.Is(err, ErrConfig) {
			t.Errorf("Open(cassandra, %+v): %v, want ErrConfig", c, err)
		}
	}
}
