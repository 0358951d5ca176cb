package backends

import (
	"context"
	"testing"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

// TestConformanceCassandra runs the whole conformance suite on Cassandra
// as Open gives it to the server: the coordinator's transactions over a
// store that reads at QUORUM.
func TestConformanceCassandra(t *testing.T) {
	contacts := testenv.CassandraContacts(t)
	storagetest.Run(t, func(t *testing.T) storage.Backend {
		b, err := Open(context.Background(), "cassandra", Config{Contacts: contacts, Keyspace: "kiroku_backends"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
