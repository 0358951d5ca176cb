package engine

// A TID word is one uint64 per record, read and written atomically:
//
//	bit  63 ........ 24 | 23 ......... 3 |    2   |   1    |  0
//	     epoch (40 bits) | seq (21 bits)  | absent | latest | lock
//
// The version (epoch and sequence) orders every committed write of a
// record; commit TIDs are chosen greater than every version a transaction
// read or overwrote, so versions increase along every dependency. lock is
// held by a committing transaction between locking its write set and
// installing; latest is Silo's latest-version bit: a record without it has
// been replaced in its index, and a transaction that locks it aborts.
// kiroku never replaces or unlinks records (a deleted row stays, absent),
// so today every record keeps it; absent marks a record that has no
// committed row (never written, or deleted).
const (
	tidLock   uint64 = 1 << 0
	tidLatest uint64 = 1 << 1
	tidAbsent uint64 = 1 << 2

	tidStatusBits = 3
	tidSeqBits    = 21
	tidEpochShift = tidStatusBits + tidSeqBits
	tidStatusMask = 1<<tidStatusBits - 1

	maxSeq = 1<<tidSeqBits - 1
	// MaxEpoch is the largest epoch a TID can carry. At one epoch every
	// 40 ms that is 1,393 years; if waiting committers close epochs early,
	// at most one per log fsync (about 10,000 a second here), 3.4 years.
	MaxEpoch = 1<<(64-tidEpochShift) - 1
)

func makeTID(epoch, seq uint64) uint64 { return epoch<<tidEpochShift | seq<<tidStatusBits }

// tidEpoch is the epoch of a TID word.
func tidEpoch(t uint64) uint64 { return t >> tidEpochShift }

func tidSeq(t uint64) uint64 { return t >> tidStatusBits & maxSeq }

// tidVersion strips the status bits.
func tidVersion(t uint64) uint64 { return t &^ tidStatusMask }

// nextTID returns the smallest TID of epoch e greater than after (a
// version), or false if epoch e has no sequence number left above it.
func nextTID(after, e uint64) (uint64, bool) {
	switch ae := tidEpoch(after); {
	case ae < e:
		return makeTID(e, 1), true
	case ae > e:
		return 0, false // cannot happen: every version read was made in an epoch ≤ e
	}
	if tidSeq(after) == maxSeq {
		return 0, false
	}
	return tidVersion(after) + 1<<tidStatusBits, true
}
