// Package auditor is the Auditor: a second administrative domain that
// detects Byzantine faults of the ledger synchronously, inside every
// transaction — seed 000's baseline, after ScalarDL's Auditor. Where the
// Validator (package validator) lets the ledger commit and checks the
// history afterwards, a client in Auditor mode accepts a result only once
// both domains agree on it.
//
// # The two domains
//
// The ledger (package server) and the Auditor are run by different
// operators, each with its own database and its own signing key. The
// Auditor keeps a replica of every asset's versions, built only from what
// it validated: for each asset its latest age, the hash of that version
// and its output. A client is enrolled in both domains and signs each
// request once; both verify that signature.
//
// # The protocol
//
// Ordering. The client sends its signed request to the Auditor. The
// Auditor runs the contract against its replica, which yields the assets
// it reads and writes and the result it should have. It locks them —
// shared for assets only read, exclusive for assets written — so that
// conflicting requests are ordered and the others run in parallel
// (lockTable), records the order durably, and returns an ordering token:
// the request's nonce and digest, the Auditor's identity and a lease
// deadline, signed with the Auditor's key.
//
// Commit. The client sends the request with the token to the ledger. A
// ledger configured for an Auditor refuses a request without a valid,
// unexpired token for exactly that request. It executes and commits as
// always and returns the result, its proofs and its receipt.
//
// Validation. The client hands the result, proofs and receipt to the
// Auditor. Holding the locks, the Auditor's replica is still the state the
// contract ran against at Ordering, so its run then is the run the ledger
// had to make: it checks the ledger's signatures, the output, the
// versions read (receipt input) and written (age and hash, chained from
// its replica's), commits the new versions to its replica, releases the
// locks and countersigns the receipt. A disagreement is a typed error
// (ByzantineFault) naming the asset, the version and the check; the
// client reports it at once, and the Auditor records it. Only what the
// ledger signed can be its fault: a reply whose receipt or proofs do not
// verify with the ledger's key, or a receipt of another nonce, proves
// nothing (anyone can send one) and is refused, the order kept for the
// ledger's real reply or for recovery. A transaction validated already
// is approved again for exactly its receipt, so a client whose reply was
// lost, or came back after recovery settled its request, gets its
// approval.
//
// The network side is package auditor/auditorsrv (`kiroku auditor`);
// the Go SDK's Auditor mode (client.Config.Mode) takes a request through
// the three phases.
//
// # Failures between the phases
//
// Locks are leases. When one runs out — the client crashed, a reply was
// lost, the ledger timed out — the Auditor settles the request itself: it
// asks the ledger for the transaction's state by nonce. Committed: it
// fetches the versions written with their proofs and validates them as a
// client would have brought them. Not committed: it makes sure it never
// will be, by having the ledger record the nonce as aborted (a request
// whose nonce is recorded cannot run), and drops the order. Only then
// are the locks released, so no lock is stuck for ever and no committed
// transaction goes unvalidated.
//
// # Invariants
//
//   - Conflicting requests are validated in the order the Auditor gave
//     them, and each runs on the ledger only while it holds its locks: a
//     request that saw another's write on the Auditor's replica runs after
//     it on the ledger, and one that did not, runs before it.
//   - The replica holds only validated versions: a version enters it when
//     the ledger's proof of it matched the Auditor's own run, so the
//     replica is a history both domains signed.
//   - A result the client accepted carries both signatures over the same
//     receipt: neither domain alone can forge or alter it.
//   - Every ordered request ends validated, or aborted on the ledger, before
//     its locks go to the next one.
package auditor
