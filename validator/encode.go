package validator

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"unsafe"

	"github.com/kiroku-db/kiroku/ledger"
)

// The logged outcome's JSON columns are written by hand: encoding/json's
// reflection was a tenth of the Validator's logging CPU. The bytes are
// exactly what json.Marshal writes for the same values (proofJSON, a
// map[string]int64), so rows logged before and after read back alike;
// TestOutcomeJSONMatchesEncodingJSON holds the two together.

// jsonText returns the JSON that appendTo writes, in a buffer sized by
// size (an estimate) and handed over as a string without a copy: nothing
// writes the buffer once appendTo returns.
func jsonText(size int, appendTo func([]byte) []byte) string {
	b := appendTo(make([]byte, 0, size))
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// idAgesSize estimates the encoded size of an id → age map.
func idAgesSize(m map[string]int64) int {
	n := 2
	for k := range m {
		n += len(k) + 24 // quotes, colon, comma and up to 20 digits
	}
	return n
}

// proofsSize estimates the encoded size of ps.
func proofsSize(ps []ledger.Proof) int {
	n := 2
	for i := range ps {
		p := &ps[i]
		n += 100 + len(p.ID) + len(p.Nonce) + idAgesSize(p.Input) + 4*(len(p.Hash)+len(p.PrevHash)+len(p.Signature)+6)/3
	}
	return n
}

// appendIDAges appends m as json.Marshal does: keys in order, nil as null.
func appendIDAges(b []byte, m map[string]int64) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	var small [4]string
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = strconv.AppendInt(b, m[k], 10)
	}
	return append(b, '}')
}

// appendProofs appends ps as json.Marshal writes the []proofJSON of them.
func appendProofs(b []byte, ps []ledger.Proof) []byte {
	b = append(b, '[')
	for i := range ps {
		p := &ps[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, p.ID)
		b = append(b, `,"age":`...)
		b = strconv.AppendInt(b, p.Age, 10)
		b = append(b, `,"nonce":`...)
		b = appendJSONString(b, p.Nonce)
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

// appendJSONString appends s quoted. A string of printable ASCII that
// json.Marshal would not escape is copied; any other takes json.Marshal,
// with its escapes for HTML characters, control characters, invalid UTF-8
// and U+2028/U+2029.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
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
