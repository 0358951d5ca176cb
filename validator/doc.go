// Package validator detects Byzantine faults of a kiroku ledger after the
// fact, from a second administrative domain (seed 000 §3.3–3.4, §4.2). It is
// a client-side library used in place of the SDK: it keeps its own database
// (an embedded engine in its own data directory, or a PostgreSQL its
// operator runs) that the ledger's operator cannot touch, and needs no
// replica of the ledger and no consensus round.
//
// # Logging (Algorithm 1)
//
// ExecuteRequest takes a begin clock and stores the request ⟨n, f, a, s⟩
// with it (and a pending mark) in one transaction of the Validator
// database before the request is sent. When the reply arrives it takes an
// end clock and stores the outcome: for a commit, the ledger's signed
// receipt (read set, write set, result) and proofs — the read-write set is
// keys and ages only, never values. A refusal or abort is stored as
// aborted. A reply that never arrives leaves the transaction in doubt for
// Recover (§3.4): it asks the ledger (GetTxState), stamps an end clock with
// the receipt and proofs of a committed one, an end clock only for an
// aborted one, and waits Config.TxTimeout before stamping one the ledger
// does not know. The end stamp is conditional on none being there, so the
// client and a concurrent Recover cannot both stamp. Logging takes no lock
// and writes no shared row besides the clock's counters, when it raises
// them to an end clock, so client threads do not serialize on it: on an
// exclusive database in a write of its own, once every reserveAhead end
// clocks; on a shared one in the transaction that stamps a group of
// outcomes (below).
//
// # The logical clock (§4.2.2–4.2.3)
//
// The clock table holds K counters. A begin clock scans them and takes
// max + 1; it writes nothing. An end clock scans them, takes max + 1 and
// raises one counter (round-robin) to that value with a write conditional
// on the stored value being smaller, so counters only grow. Neither the
// scans nor the write are transactional, and that is safe. Write b_i for
// T_i's begin clock and e_i for its end clock, and call T_i's real
// interval the time from its begin scan until its end scan; the ledger's
// execution of T_i (send to reply) lies inside it. Since an end scan comes
// after its own begin scan, e_i ≥ b_i.
//
//   - Overlap is never missed. If T_i and T_j really overlapped, T_j's end
//     scan came after T_i's begin scan, and counters never decrease, so it
//     saw at least b_i − 1 and e_j ≥ b_i; likewise e_i ≥ b_j. Their clock
//     intervals [b, e] overlap.
//   - Precedence is never invented. If T_i's end scan did not come before
//     T_j's begin scan, it saw at least b_j − 1, so e_i ≥ b_j. Hence
//     e_i < b_j only if T_i's real interval ended before T_j's began.
//   - Real precedence shows (this is what makes a stale read detectable).
//     If T_i's ExecuteRequest returned — its end write done — before T_j's
//     begin scan, that scan saw e_i, so b_j > e_i. A begin write would add
//     nothing to any of the three, so there is none.
//
// Concurrent callers in one process share scans: those who ask for a
// clock while another caller's scan (and, for an end clock, write) runs
// get the result of the next run, which starts after all of them asked.
// A shared scan is each member's own scan in the arguments above: it
// began after the member asked, and an end clock's write is done before
// any member returns. Members may get equal clocks, and equal clocks
// order nothing (e_i < b_j is strict).
//
// A stale scan only makes a clock smaller than it could be, which can
// widen intervals (more transactions look concurrent: more work, no false
// alarm) but cannot break the first two properties, because each rests on
// a scan seeing a value written, or seen, before the scan began.
//
// ScanEvery (N) lets a begin clock skip the table N−1 times in N and use
// one more than the highest value this process has read or written — a
// value some counter already held, so this is a stale scan (and the third
// property holds only for what this process has seen). End clocks never
// skip the scan unchecked: an end clock that is too small could make two
// overlapping transactions look ordered. (A claimed end clock, below,
// skips it, and the commit that stamps it checks it against every
// counter.)
//
// One process. On a database no other process can reach while it is open
// (storage.Exclusive: the embedded engine locks its directory), every
// Clock of the process on that database and namespace shares one value s,
// the highest clock value handed out or read, and a reservation r, the
// value the counters were last raised to. At open both are raised to the
// counters' maximum (one scan). No clock then scans: a begin clock is
// s + 1 and writes nothing; an end clock raises s by one and is the new
// value. s never passes r: an end clock that would is handed out only
// after a counter write of r' = s + 1 + reserveAhead − 1 is done and r has
// become r', so a counter is written once every reserveAhead end clocks.
// The three properties hold with "the scan" read as "the read of s",
// because s never decreases and is raised by every end clock before its
// ExecuteRequest returns: if T_j's end read came after T_i's begin read it
// saw at least b_i − 1, so e_j ≥ b_i; if T_i's end read did not come
// before T_j's begin read, e_i ≥ b_j; and if T_i returned before T_j's
// begin read, s held e_i, so b_j > e_i. Only the next process to open the
// database needs the counters: every e and every b − 1 handed out is at
// most a reservation some counter was written with before, and a logged b
// or e is durable only after that write (below), so the open's scan starts
// at or above every b − 1 and every e that a durable log row carries, and
// the clocks it hands out are above those e. Values between the last
// clock handed out and the reservation are skipped after a reopen, which
// only leaves gaps. A Validator on a database other processes share
// (PostgreSQL) must scan, as above.
//
// The clock reads and writes through the backend's unsynced view
// (storage.Unsynced), without waiting for durability: a clock value
// matters only inside the log rows that carry it, and those are written
// after the clock was read or written (a request by a durable commit, an
// outcome through the view as well), so by the view's prefix promise no
// such row is durable before the counter values it depends on. After a
// crash every counter value that some logged end
// clock e needs (e itself) or some logged begin clock b needs (b − 1) is
// still there. On a backend without such a view (PostgreSQL) every clock
// write is durable.
//
// # Durability of the log
//
// The request is stored durably before it is sent: a request the ledger
// may have received is never missing from the log, even after a crash of
// the client process. The outcome is stored through the unsynced view as
// well, and ExecuteRequest returns without waiting for it to be durable.
// A crash may lose it (and the counter value of its end clock), and that
// is safe: the request row is still there, so the transaction is in
// doubt again and Recover resolves it from the ledger's GetTxState and
// proofs, with an end clock taken then — later than the lost one, which
// only widens its interval (more transactions look concurrent, no false
// alarm). By the view's prefix promise the outcome is durable as soon as
// any later durable commit is: the next logged request, or the
// validation that reads it, so no validation result rests on an outcome
// a crash could take back. On an exclusive database (the engine) a
// logged transaction so costs the Validator database one durable commit
// (the request) and one write that waits for no fsync (the outcome); no
// clock scans, and a counter write serves reserveAhead end clocks
// (above). On PostgreSQL every commit is durable, and the clocks are
// taken in the commits that log the request and stamp the outcome (below).
//
// # Group commit on a shared database
//
// On a database other processes share (PostgreSQL), where every commit is
// a round trip to the server and a WAL flush, concurrent callers' log
// writes are committed in groups: the requests that callers log while one
// group of requests commits wait, and go in the next transaction together,
// and likewise the outcomes. A caller alone commits at once. A group
// takes at most 64 callers; the next ones form the group after it, so each
// kind has one transaction under way at a time however many callers wait
// (callers committing alone beside it would fight over the clock's
// counters, which every stamp transaction raises). Both the
// request's condition (not logged yet) and the outcome's (not stamped
// yet) are Deferred, so a group of n costs one round trip rather than n,
// and one WAL flush. Grouping changes no promise: a caller's writes are in
// exactly one committed transaction when its call returns. If a group
// fails (a member's nonce is already logged, or Recover stamped a
// member's transaction first), nothing of it was written, and each member's
// writes are committed on their own, one transaction after another, so
// only that member fails; after a commit whose
// outcome is unknown every member gets that error, as it would alone. The
// engine does not group: its commits are already grouped by its epochs,
// and a hand-off between callers there only adds a wait.
//
// There the stamp committer takes the group's end clock itself, in the
// transaction that stamps the outcomes: every member's reply has arrived
// before that transaction runs, so one end clock serves them all. Its
// first try needs no scan. It claims s + 1, where s is the highest value
// this process has seen, by raising every counter to s + 1, each write
// Deferred on the counter holding less; the whole transaction is then one
// round trip. It commits only if, when it ran, every counter was below
// s + 1; and some counter held s already (the process read s there, or
// raised one to it), so s + 1 is max + 1 of the counters at that point,
// as an end scan there would have found; and since each counter was written, none
// could be raised past it before the commit. If another process raised a
// counter meanwhile, a condition fails and nothing is written; the end
// clock then comes from a scan, which it shares with begin clocks, and the
// transaction raises one counter to it with a Skippable write (a counter
// already past it needs nothing), again without a round trip of its own.
// After a failed claim the committer scans for a while (doubling after
// each failure in a row) before it claims again. Either way the clock's
// three properties still hold. The first two rest on reads taken after
// the replies arrived, and the claim's conditions are such a read. The
// third needs a counter to hold e_i once T_i's ExecuteRequest returns,
// and it does: the stamp committed first, and with it the counter write.
// A group that fails takes its counter writes back with its stamps; the
// members' end clocks are then in no log row, and each member's stamp
// takes its own. The value this process has seen (for ScanEvery and
// claims) is raised only after the commit, so a begin clock never builds
// on a value no counter holds. A later scan may run before an earlier
// group commits and hand out the same value again; equal clocks order
// nothing, so that only makes intervals meet.
//
// The request committer takes the group's begin clock the same way, in
// the transaction that logs the requests: every member asked for its
// clock before that transaction began, and the requests are sent only
// after it commits. It claims s + 1 by expecting every counter to hold
// less (storage.Expect), which writes nothing and, like the Deferred
// writes, costs no round trip of its own. If it commits, the counters as
// the transaction read them held at most s, and one held s, so s + 1 is
// max + 1 of that read: a begin scan made after every member asked and
// before any request was sent, which is all the three properties ask of
// one. If a counter was raised past s meanwhile, nothing is written, and
// the begin clock comes from a scan (Clock.Begin), with the same backoff
// as for end clocks. A begin clock claimed is in no counter, so it does
// not raise the value this process has seen. A logged transaction then
// costs the database two round trips, both commits, and no scan, while
// no other process raises the counters.
//
// # Validation (Algorithm 2), and strict serializability
//
// Validate covers every logged transaction not yet validated, in one pass:
//
//  1. Signatures. The receipt and every proof must verify under the
//     ledger's key (pinned in the Validator database on first use), name
//     this nonce and contract, and agree with each other (one proof per
//     write, the receipt's read set).
//  2. I/O check. The request is re-executed (ledger.Replay) on the
//     Validator's own recomputed states of the versions its read set
//     names, in reads-from order; the result, each written version's hash
//     (which covers the output) and each prev_hash must match what the
//     ledger returned. The recomputed states are stored; later
//     re-executions read them, never the ledger's copy. Contracts are
//     deterministic and hermetic (ledger package doc), so a divergence is
//     the ledger's fault.
//  3. The MVSG over the new transactions and their context: wr edges
//     (reads-from), ww edges (version order) and rw edges
//     (anti-dependencies), from the read-write sets. Cycles are found with
//     Tarjan's algorithm in O(V+E); two committed writers of one version
//     are reported as a duplicate version.
//  4. Real time. An edge From → To says From precedes To in every
//     equivalent serial order. If e_To < b_From, To really finished before
//     From began (the precedence property above), so no strictly
//     serializable execution has this edge: on an rw edge it is a stale
//     read (From read a version To had already replaced, "time travel"),
//     on a wr edge a read from the future, on a ww edge versions ordered
//     against real time. This is the strict-serializability check seed
//     000 leaves as future work; with the clock's properties it never
//     accuses an honest ledger, whose serialization order respects real
//     time.
//
// The violations validation finds are recorded in the Validator database,
// keyed by what they are (so validating the same transactions again does
// not record them twice), and a later Validate scoped to a key, a key range
// or a transaction reports them. The ledger cross-check's findings
// (dropped, reordered, unlogged or replayed versions, and outputs that
// differ from the Validator's states) are not recorded: the cross-check
// compares against the ledger's history as it is now, so each run that
// asks for it finds them again.
//
// # Incremental validation, and why its window suffices
//
// A run reads the clock's current value H (the highest counter; on an
// exclusive database the shared value s, not the reservation, which runs
// ahead of the clocks handed out), then the pending transactions. It
// validates those that ended at or before H and before the
// earliest still-unresolved one began; the others wait, and so does any
// transaction that read a version a waiting one wrote (an unresolved
// transaction is never treated as absent). A transaction the pending scan
// missed was logged after the scan began, so whatever read its writes ended
// after that and has an end clock above H. Validated transactions are
// marked; no run repeats their work. The graph of a run holds the new transactions N, every
// validated transaction whose clock interval reaches back into theirs
// (ended at or after the earliest begin, widened until stable), and every
// transaction that shares a version with any of them. Why that finds every
// cycle through N: call W the window so built; no transaction outside W
// ended at or after the earliest begin B of W. Take a cycle through N with
// no real-time violation on its edges. If it left W, some edge would run
// from a member Y of W to an X outside it; X ended before B ≤ b_Y, so
// e_X < b_Y, a real-time violation on that edge — which step 4 reports,
// since the edge has an endpoint in the graph (X shares a version with Y).
// So a cycle with no real-time violation lies in W, and Tarjan finds it.
// Cycles among older transactions alone were the business of earlier runs.
//
// # Cross-checking the ledger's history
//
// With Scope.CrossCheck, a run also reads the ledger's history of the keys
// in scope and compares it with the log: a logged version that is missing
// (dropped), at another age (reordered), or stored with another output
// (tampered after commit) is reported, and so is a version no logged
// committed transaction wrote (replayed, unlogged, or committed after the
// ledger reported it aborted). This assumes every writer of those keys
// logs through a Validator sharing this database, as seed 000's clients
// do.
package validator
