package engine

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// TestSpansStayBounded appends more spans than are kept and checks that
// truncation never cuts past what a checkpoint covers.
func TestSpansStayBounded(t *testing.T) {
	db := &DB{}
	for i := uint64(1); i <= 3*maxSpans; i++ {
		db.addSpanLocked(logSpan{last: 10 * i, maxEpoch: i})
		db.addSpanLocked(logSpan{last: 10*i + 5, maxEpoch: i}) // same epoch: replaces
	}
	if len(db.spans) > maxSpans {
		t.Fatalf("%d spans kept", len(db.spans))
	}
	for i, sp := range db.spans {
		if sp.last != 10*sp.maxEpoch+5 || (i > 0 && sp.maxEpoch <= db.spans[i-1].maxEpoch) {
			t.Fatalf("span %d: %+v after %+v", i, sp, db.spans[max(0, i-1)])
		}
	}
}

// TestFreeBuffersWarmestFirst checks the free list hands out the buffer
// written last first, keeps the newest when full, and drops a buffer a
// large transaction grew.
func TestFreeBuffersWarmestFirst(t *testing.T) {
	const size = 4 << 10
	lg := &logger{db: &DB{cfg: Config{LogBufferSize: size}}}
	bufs := make([]*logBuf, maxFree+8)
	for i := range bufs {
		bufs[i] = &logBuf{data: make([]byte, 0, size)}
	}
	grown := &logBuf{data: make([]byte, 0, 3*size)}
	lg.putFree(bufs[:4])
	lg.putFree([]*logBuf{grown})
	lg.putFree(bufs[4:])
	for i := len(bufs) - 1; i >= len(bufs)-maxFree; i-- {
		if b := lg.newBuf(7); b != bufs[i] {
			t.Fatalf("newBuf %d from the top: got another buffer than the one freed %d-th", len(bufs)-i, i)
		} else if b.epoch != 7 || len(b.data) != 2 || b.data[0] != recBuffer {
			t.Fatalf("reused buffer not reset: epoch %d, data %v", b.epoch, b.data)
		}
	}
	if b := lg.newBuf(7); cap(b.data) != size+size/4 || b == grown {
		t.Fatalf("an empty free list gave a buffer of capacity %d, want a new one", cap(b.data))
	}
}

// stageWorker is a worker whose logger, with no engine behind it, takes
// buffers of 512 KiB, and ten writes to one table of the keys and values
// kv gives, with the sum of their bounds.
func stageWorker(kv func(i int) (pk string, value []byte)) (*worker, []writeEntry, int) {
	tb := &table{id: 3}
	w := &worker{}
	w.lg = &logger{db: &DB{cfg: Config{LogBufferSize: 512 << 10}, maxRecord: 1 << 20}}
	writes, bound := make([]writeEntry, 10), 0
	for i := range writes {
		pk, v := kv(i)
		writes[i] = writeEntry{wkey: wkey{t: tb, pk: pk}, out: newRow([]storage.Value{storage.Blob(v)})}
		bound += writeBound(pk, "", writes[i].out)
	}
	return w, writes, bound
}

// TestLogPacksKeys logs ten writes whose keys share their first 11 bytes
// through a worker's stage: after the first, each write carries one byte
// of its key and no table id.
func TestLogPacksKeys(t *testing.T) {
	w, writes, bound := stageWorker(func(i int) (string, []byte) { return fmt.Sprintf("account-%04d", i), []byte("8 bytes.") })
	w.log(writes, 1, 1, bound)
	// The entry's header; the first write: head, table, key length, key,
	// row (count, type, length, value); then head, length, key byte, row.
	if want := entryHeader + (3 + 12 + 11) + 9*(3+11); len(w.stage) != want {
		t.Fatalf("the entry takes %d bytes, want %d", len(w.stage), want)
	}
}

// TestLogStageKeepsRecordsWhole logs transactions of every size through a
// worker's stage and checks what reaches the logger: every record within
// the sink's limit, every buffer of one epoch, and every transaction's
// writes in order under its TID, once, whatever entries carried them, and
// in one entry if it fits in a stage. Among them is a transaction whose
// only write is close to the largest a record takes, logged after smaller
// ones filled part of a buffer, and one whose middle write grows the stage
// past twice its limit part way through a split (the stage must keep room
// for the transactions after it).
func TestLogStageKeepsRecordsWhole(t *testing.T) {
	const maxRecord = 16 << 10
	tbl := newTable(5, &storage.Table{Namespace: "n", Name: "t",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBlob}}})
	lg := &logger{db: &DB{cfg: Config{LogBufferSize: 6 << 10}, maxRecord: maxRecord}}
	w := &worker{}
	w.lg = lg

	type logged struct {
		tid    uint64
		epoch  uint64
		writes []string // pk=value-length
	}
	var want []logged
	fits := map[uint64]bool{} // the transaction's entry fits in a stage
	rng := rand.New(rand.NewPCG(1, 2))
	tid := uint64(0)
	for i := range 400 {
		e := uint64(1 + i/100)
		n := 1 + rng.IntN(12)
		sizes := make([]int, n)
		for j := range sizes {
			sizes[j] = rng.IntN(300)
		}
		switch i % 50 {
		case 7: // larger than a stage, in many writes
			sizes = slices.Repeat([]int{3000}, 7)
		case 8: // one write near the record limit
			sizes = []int{maxRecord - 64 - 64}
		case 9: // a write that grows the stage past twice its limit, part way through a split
			sizes = []int{100, 13000, 100}
		}
		tid++
		l := logged{tid: tid, epoch: e}
		writes, bound := make([]writeEntry, len(sizes)), 0
		for j, sz := range sizes {
			pk := fmt.Sprintf("k%d-%d", i, j)
			writes[j] = writeEntry{wkey: wkey{t: tbl, pk: pk}, out: newRow([]storage.Value{storage.Blob(make([]byte, sz))})}
			n := writeBound(pk, "", writes[j].out)
			if n > maxRecord-64 {
				t.Fatalf("test write of %d bytes exceeds what commit lets through", n)
			}
			bound += n
			l.writes = append(l.writes, fmt.Sprintf("%s=%d", pk, sz))
		}
		want = append(want, l)
		fits[tid] = entryHeader+bound <= w.stageLimit()
		w.log(writes, tid, e, bound)
	}
	w.flushStage()
	if w.buf != nil {
		lg.handoff(w.buf)
	}

	var got []logged
	entries := map[uint64]int{}
	for _, b := range lg.mu.queue {
		if len(b.data) > maxRecord {
			t.Fatalf("a record of %d bytes; the sink takes %d", len(b.data), maxRecord)
		}
		r, err := decodeRecord(b.data)
		e := r.epoch
		if err != nil || r.kind != recBuffer || e != b.epoch {
			t.Fatalf("record header: kind %d epoch %d (buffer's %d): %v", r.kind, e, b.epoch, err)
		}
		_, n := binary.Uvarint(b.data[1:])
		d := decoder{b: b.data[1+n:]}
		for len(d.b) > 0 && d.err == nil {
			tid, count := d.u64("tid"), d.bytes(4, "count")
			if d.err != nil {
				break
			}
			if entries[tid]++; entries[tid] > 1 && fits[tid] {
				t.Fatalf("transaction %d fits in a stage but was split", tid)
			}
			if len(got) == 0 || got[len(got)-1].tid != tid {
				got = append(got, logged{tid: tid, epoch: e})
			} else if got[len(got)-1].epoch != e {
				t.Fatalf("transaction %d split across epochs %d and %d", tid, got[len(got)-1].epoch, e)
			}
			var prev *logWrite
			for range binary.LittleEndian.Uint32(count) {
				wr, _, ok := d.packedWrite(prev, func(uint64) *table { return tbl })
				prev = &wr
				if !ok {
					t.Fatalf("transaction %d: undecodable write: %v", tid, d.err)
				}
				last := &got[len(got)-1]
				last.writes = append(last.writes, fmt.Sprintf("%s=%d", wr.pk, len(wr.row.values(tbl)[0].AsBlob())))
			}
		}
		if d.err != nil {
			t.Fatalf("buffer of epoch %d: %v", e, d.err)
		}
	}
	if !reflect.DeepEqual(got, want) {
		for i := range min(len(got), len(want)) {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Fatalf("transaction %d of %d: logged %+v, want %+v", i, len(want), got[i], want[i])
			}
		}
		t.Fatalf("%d transactions logged, want %d", len(got), len(want))
	}
}
