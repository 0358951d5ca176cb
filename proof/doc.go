// Package proof holds the records kiroku's ledger and its clients
// exchange, and what it takes to build, sign and check them without the
// ledger itself: a Request and a ContractRegistration a client signs; a
// Version of an asset, hash-chained to the one before; the Proof the
// ledger signs for each version it writes and the Receipt it signs for
// each committed transaction; a transaction's recorded TxState; and the
// errors the ledger answers with, by kind.
//
// The SDK (client), the Validator and the Auditor import this package to
// sign requests and check what a ledger returned. It depends on auth and
// the standard library only, not on the ledger's contract interpreter or
// storage; client's TestSDKStaysSmall holds it to that.
//
// # Encodings
//
// Everything the ledger hashes or signs has one canonical byte string,
// built by one encoder (encode.go) and described byte for byte in
// ledger/FORMAT.md; testdata/vectors holds frozen encodings, hashes and
// signatures that the ledger's TestVectors checks. Each string starts with
// a domain tag of its kind, so a signature made for one kind is never
// valid for another. SigningBytes and HashBytes return a record's bytes;
// Sign and Verify sign and check them with an auth.Signer or
// auth.Verifier; Version.ComputeHash hashes a version.
//
// # Errors
//
// Every error the ledger returns for a bad request, a failed contract or
// a missing object wraps exactly one of this package's sentinels
// (ErrBadRequest, ErrNonceReused, ErrContractFailed, ...). Each has a
// stable kind name (Kind, Kinds), which the server sends beside the error
// and the SDK turns back into the same sentinel (KindError), so callers
// on either side test with errors.Is.
package proof
