package proof

import (
	"encoding/json"
	"slices"
	"strconv"
)

// AppendAgeMapJSON appends an id → age map (an input or write set) exactly
// as encoding/json encodes it (keys in byte order, escaped as
// AppendJSONString escapes them), without reflection, except that a nil
// map is written {}. The ledger stores input and write sets in this form
// (ledger/FORMAT.md, "Stored rows"), and the Validator logs them so.
func AppendAgeMapJSON(b []byte, m map[string]int64) []byte {
	var kb [8]string
	keys := appendSortedKeys(kb[:0], m)
	n := 2
	for _, k := range keys {
		n += len(k) + 24 // quotes, colon, comma and up to 20 digits
	}
	b = slices.Grow(b, n)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendJSONString(b, k)
		b = append(b, ':')
		b = strconv.AppendInt(b, m[k], 10)
	}
	return append(b, '}')
}

// AppendJSONString appends s quoted exactly as encoding/json quotes it,
// without reflection for printable ASCII ('<', '>' and '&' escaped as
// \u003c, \u003e, \u0026). Asset ids are printable ASCII (the ledger
// refuses any other); any other string takes encoding/json, with its
// escapes for control characters, invalid UTF-8 and U+2028/U+2029.
func AppendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '<', '>', '&':
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
