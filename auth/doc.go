// Package auth implements the signature schemes of the kiroku ledger.
//
// Kiroku is a tamper-evident database: clients sign the requests they send,
// and the ledger signs the proofs it hands back. Both directions use the same
// two small interfaces, [Signer] and [Verifier], so the rest of the code base
// never has to know which algorithm is behind a key.
//
// # Schemes
//
// Two schemes are supported, identified by [Scheme]:
//
//   - [SchemeHMAC]: HMAC-SHA256 over the raw message with a shared secret of
//     [MinSecretLen] to [MaxSecretLen] bytes. Cheap, symmetric, suited to
//     trusted clients. Verification compares MACs in constant time.
//   - [SchemeECDSA]: ECDSA on NIST P-256 over SHA-256(message), with
//     ASN.1 DER encoded signatures. Public keys are distributed as X.509
//     certificates in PEM form, which [ParseCertificatePEM] parses strictly.
//
// Every failure to verify, whatever its cause (wrong key, altered message,
// malformed or oversized signature), is reported as an error wrapping
// [ErrBadSignature], so callers only need a single errors.Is check and learn
// nothing an attacker could exploit from distinguishing the cases.
//
// # Keys at rest
//
// HMAC secrets the server must remember are sealed with a [SecretBox]
// (AES-256-GCM with a random nonce and a leading format version byte). The
// box key itself, and the ledger's own ECDSA signing key, live in files the
// server creates on first start with [LoadOrCreateSecretKey] and
// [LoadOrCreateECDSAKey]. Those files are created atomically and durably: the
// content is written to a private temporary file in the target directory,
// fsynced, hard-linked to the final name (which fails if the name already
// exists), and the directory is fsynced. A crash therefore never leaves a
// partially written key under the final name, and two processes starting
// concurrently end up using the same key.
//
// # Errors
//
// All errors returned by this package carry an "auth:" prefix with context.
// Errors caused by bad input (signatures, certificates, keys, secrets, scheme
// names, sealed data) wrap one of the sentinel errors declared in errors.go
// and can be classified with errors.Is; failures of the file system or of the
// system random source wrap the underlying error instead.
//
// All signers, verifiers and secret boxes are safe for concurrent use.
package auth
