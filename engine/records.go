package engine

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// The engine keeps one log, and everything that changes its state is a
// logRecord in it, so that every replica reaches the same state by applying
// the same records in the same order (apply.go). A logRecord starts with its
// kind (FORMAT.md has the bytes):
//
//	buffer = 3 uvarint(epoch) txn*                 committed writes of one epoch (log.go)
//	mark   = 4 uvarint(logger) uvarint(X)          every logRecord of this logger of an epoch ≤ X
//	                                               is in the log before this mark
//	ddl    = 5 uvarint(epoch) json(ddlOp)          a catalog change, applied at once
//	void   = 6 uvarint(from) uvarint(to)           epochs that never became durable: their
//	                                               buffers are dropped, never applied
//	era    = 7 uvarint(loggers) uvarint(first)     a leader starts: its loggers, and the first
//	                                               epoch it commits in
//	floor  = 8 uvarint(F)                          the log is about to lose the records of
//	                                               epochs before F (a checkpoint from F holds them)
//
// Kind 1 (a buffer whose writes are not packed) is still read; kind 2 (a
// mark of the per-logger logs of older versions) is not: those data
// directories are refused at Open.
const (
	recPlainBuffer byte = 1
	recOldMark     byte = 2
	recBuffer      byte = 3
	recMark        byte = 4
	recDDL         byte = 5
	recVoid        byte = 6
	recEra         byte = 7
	recFloor       byte = 8
)

// maxLoggers bounds Config.Loggers and an era logRecord's count.
const maxLoggers = 64

func markRecord(logger int, x uint64) []byte {
	return binary.AppendUvarint(binary.AppendUvarint([]byte{recMark}, uint64(logger)), x)
}

func voidRecord(r epochRange) []byte {
	return binary.AppendUvarint(binary.AppendUvarint([]byte{recVoid}, r.From), r.To)
}

func eraRecord(loggers int, first uint64) []byte {
	return binary.AppendUvarint(binary.AppendUvarint([]byte{recEra}, uint64(loggers)), first)
}

func floorRecord(f uint64) []byte { return binary.AppendUvarint([]byte{recFloor}, f) }

func ddlRecord(epoch uint64, op ddlOp) ([]byte, error) {
	body, err := json.Marshal(op)
	if err != nil {
		return nil, err
	}
	return append(binary.AppendUvarint([]byte{recDDL}, epoch), body...), nil
}

// logRecord is a decoded log logRecord's header: its kind and the numbers that
// follow it. Buffers keep their transactions undecoded (applyBuffer reads
// them); a DDL logRecord keeps its operation.
type logRecord struct {
	kind byte
	// epoch: a buffer's or a DDL's epoch; a void's From; an era's first
	// epoch; a floor's F.
	epoch uint64
	// x: a mark's X; a void's To.
	x      uint64
	logger int // a mark's logger; an era's logger count
	op     ddlOp
}

// decodeRecord decodes a logRecord's header, checking what can be checked
// without the state it applies to. It never panics.
func decodeRecord(rec []byte) (logRecord, error) {
	if len(rec) == 0 {
		return logRecord{}, malformed("empty log logRecord")
	}
	r := logRecord{kind: rec[0]}
	d := decoder{b: rec[1:]}
	switch r.kind {
	case recBuffer, recPlainBuffer:
		r.epoch = d.uvarint("epoch")
		if d.err == nil && (r.epoch == 0 || r.epoch > MaxEpoch) {
			return r, malformed("buffer of epoch %d", r.epoch)
		}
		return r, d.err
	case recMark:
		r.logger, r.x = int(min(d.uvarint("logger"), maxLoggers)), d.uvarint("mark")
		if d.err == nil && (r.logger >= maxLoggers || r.x >= MaxEpoch) {
			return r, malformed("mark %d of logger %d", r.x, r.logger)
		}
	case recDDL:
		r.epoch = d.uvarint("epoch")
		if d.err != nil {
			return r, d.err
		}
		if err := json.Unmarshal(d.b, &r.op); err != nil {
			return r, malformed("catalog change: %v", err)
		}
		if err := r.op.check(); err != nil {
			return r, malformed("catalog change: %v", err)
		}
		return r, nil
	case recVoid:
		r.epoch, r.x = d.uvarint("from"), d.uvarint("to")
		if d.err == nil && (r.epoch == 0 || r.epoch > r.x || r.x > MaxEpoch) {
			return r, malformed("void epochs %d..%d", r.epoch, r.x)
		}
	case recEra:
		r.logger, r.epoch = int(min(d.uvarint("loggers"), maxLoggers+1)), d.uvarint("first epoch")
		if d.err == nil && (r.logger < 1 || r.logger > maxLoggers || r.epoch == 0 || r.epoch > MaxEpoch) {
			return r, malformed("era of %d loggers from epoch %d", r.logger, r.epoch)
		}
	case recFloor:
		r.epoch = d.uvarint("floor")
		if d.err == nil && r.epoch > MaxEpoch {
			return r, malformed("floor %d", r.epoch)
		}
	case recOldMark:
		return r, malformed("a mark of an older log format")
	default:
		return r, malformed("logRecord kind %d", r.kind)
	}
	if d.err == nil && len(d.b) != 0 {
		return r, malformed("%d bytes after a logRecord of kind %d", len(d.b), r.kind)
	}
	return r, d.err
}

// spanEpoch is the epoch a logRecord counts as for truncation (logSpan): the
// log prefix before a checkpoint's start Cs is truncated only where every
// logRecord counts below Cs. A mark X counts as X+1: a worker may have
// committed in X+1, in memory, when the logger marked X.
func (r logRecord) spanEpoch() uint64 {
	switch r.kind {
	case recMark:
		return r.x + 1
	case recVoid:
		return r.x
	}
	return r.epoch
}

func (r logRecord) String() string {
	switch r.kind {
	case recMark:
		return fmt.Sprintf("mark %d of logger %d", r.x, r.logger)
	case recVoid:
		return fmt.Sprintf("void epochs %d..%d", r.epoch, r.x)
	case recEra:
		return fmt.Sprintf("era of %d loggers from epoch %d", r.logger, r.epoch)
	case recFloor:
		return fmt.Sprintf("floor %d", r.epoch)
	case recDDL:
		return fmt.Sprintf("%s in epoch %d", r.op.Op, r.epoch)
	}
	return fmt.Sprintf("buffer of epoch %d", r.epoch)
}
