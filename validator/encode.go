package validator

import (
	"encoding/base64"
	"strconv"
	"unsafe"

	"github.com/kiroku-db/kiroku/proof"
)

// The logged outcome's JSON columns are written by hand, with the ledger's
// encoders of strings and id → age maps: encoding/json's reflection was a
// tenth of the Validator's logging CPU. The bytes are exactly what
// json.Marshal writes for the same values (proofJSON, a map[string]int64),
// so rows logged before and after read back alike;
// TestOutcomeJSONMatchesEncodingJSON holds the two together.

// jsonText returns the JSON that appendTo writes, in a buffer sized by
// size (an estimate) and handed over as a string without a copy: nothing
// writes the buffer once appendTo returns.
func jsonText(size int, appendTo func([]byte) []byte) string {
	return view(appendTo(make([]byte, 0, size)))
}

// view returns b's bytes as a string without a copy, for the columns of a
// logged request or outcome: the backend reads a put's values before the
// put returns and keeps none of them (package storage), and nothing writes
// the request's or the reply's bytes while ExecuteRequest runs. A caller
// may reuse its buffers afterwards: the pooled logRequests still hold the
// views then, but never read them before the next refill overwrites them.
// A copy of each was four allocations per logged transaction.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// proofsSize estimates the encoded size of ps.
func proofsSize(ps []proof.Proof) int {
	n := 2
	for i := range ps {
		p := &ps[i]
		n += 100 + len(p.ID) + len(p.Nonce) + 4*(len(p.Hash)+len(p.PrevHash)+len(p.Signature)+6)/3
		for k := range p.Input {
			n += len(k) + 24
		}
	}
	return n
}

// appendIDAges appends m as json.Marshal does, nil as null.
func appendIDAges(b []byte, m map[string]int64) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	return proof.AppendAgeMapJSON(b, m)
}

// appendProofs appends ps as json.Marshal writes the []proofJSON of them.
func appendProofs(b []byte, ps []proof.Proof) []byte {
	b = append(b, '[')
	for i := range ps {
		p := &ps[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = proof.AppendJSONString(b, p.ID)
		b = append(b, `,"age":`...)
		b = strconv.AppendInt(b, p.Age, 10)
		b = append(b, `,"nonce":`...)
		b = proof.AppendJSONString(b, p.Nonce)
		b = append(b, `,"input":`...)
		b = appendIDAges(b, p.Input)
		b = append(b, `,"hash":`...)
		b = appendJSONBytes(b, p.Hash)
		b = append(b, `,"prev_hash":`...)
		b = appendJSONBytes(b, p.PrevHash)
		b = append(b, `,"sig":`...)
		b = appendJSONBytes(b, p.Signature)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendJSONBytes appends p as json.Marshal writes a []byte: standard
// base64 in quotes, nil as null.
func appendJSONBytes(b []byte, p []byte) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, p)
	return append(b, '"')
}
