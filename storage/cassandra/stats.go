package cassandra

import (
	"context"
	"strings"
	"sync/atomic"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// Stats counts the requests a DB has sent to Cassandra since it opened,
// each attempt and each page of a scan once: what its callers' operations
// cost in round trips and in Paxos rounds. The driver reports every
// request it sends (QueryObserver, BatchObserver), so a retry is counted
// where it happened; PREPARE requests, one per statement text and
// connection, are not counted.
type Stats struct {
	// Requests is every request: reads, writes, batches, schema changes.
	// On one coordinator node, each is one round trip from the client.
	Requests int64 `json:"requests"`
	// CondWrites are the lightweight transactions: conditional statements
	// and conditional batches (every write kiroku sends is one), each a
	// Paxos round on the server.
	CondWrites int64 `json:"cond_writes"`
	// SerialReads are reads at SERIAL or LOCAL_SERIAL consistency, each a
	// Paxos read on the server (it completes any round in progress).
	SerialReads int64 `json:"serial_reads"`
	// Reads are the other reads (QUORUM and the like).
	Reads int64 `json:"reads"`
}

// Sub returns s − o, the requests made between two readings.
func (s Stats) Sub(o Stats) Stats {
	return Stats{Requests: s.Requests - o.Requests, CondWrites: s.CondWrites - o.CondWrites,
		SerialReads: s.SerialReads - o.SerialReads, Reads: s.Reads - o.Reads}
}

// Stats returns the requests sent so far.
func (db *DB) Stats() Stats {
	c := db.stats
	return Stats{Requests: c.requests.Load(), CondWrites: c.condWrites.Load(), SerialReads: c.serialReads.Load(), Reads: c.reads.Load()}
}

// counters is the session's QueryObserver and BatchObserver, behind Stats.
type counters struct {
	requests, condWrites, serialReads, reads atomic.Int64
}

func (c *counters) ObserveQuery(_ context.Context, q gocql.ObservedQuery) {
	c.requests.Add(1)
	switch classify(q.Statement) {
	case stmtRead:
		if cl := q.Query.GetConsistency(); cl == gocql.Serial || cl == gocql.LocalSerial {
			c.serialReads.Add(1)
		} else {
			c.reads.Add(1)
		}
	case stmtCondWrite:
		c.condWrites.Add(1)
	}
}

// ObserveBatch counts a batch: every batch this package sends is a
// conditional one.
func (c *counters) ObserveBatch(context.Context, gocql.ObservedBatch) {
	c.requests.Add(1)
	c.condWrites.Add(1)
}

type stmtKind uint8

const (
	stmtOther stmtKind = iota
	stmtRead
	stmtCondWrite
)

// classify tells a read from a conditional write (an UPDATE, DELETE or
// INSERT with an IF clause; the statements of this package write " IF "
// in capitals) from anything else.
func classify(cql string) stmtKind {
	cql = strings.TrimLeft(cql, " \t\n")
	switch {
	case hasPrefixFold(cql, "SELECT"):
		return stmtRead
	case (hasPrefixFold(cql, "UPDATE") || hasPrefixFold(cql, "DELETE") || hasPrefixFold(cql, "INSERT")) && strings.Contains(cql, " IF "):
		return stmtCondWrite
	}
	return stmtOther
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
