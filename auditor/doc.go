// Package auditor is the Auditor: a second administrative domain that
// detects Byzantine faults of the ledger synchronously, inside every
// transaction (seed 000's baseline, after ScalarDL's Auditor).
package auditor
