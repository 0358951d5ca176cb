package wire

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
)

// TestEveryKindHasACode: each ledger error kind maps to a gRPC code of its
// own meaning, so a kind added to the ledger without a mapping here fails
// instead of reaching clients as Internal.
func TestEveryKindHasACode(t *testing.T) {
	for _, k := range ledger.Kinds() {
		if c := Code(k); c == codes.Internal || c == codes.OK || c == codes.Unknown {
			t.Errorf("kind %s maps to %v", k, c)
		}
	}
}

// TestReplyBound: the bound the ledger checks before it commits is at
// least the encoded size of the reply, for short and 128-byte ids,
// absent inputs (age -1, a 10-byte varint) and present ones, one write or
// many, and the largest signatures (ECDSA P-256, 72 bytes).
func TestReplyBound(t *testing.T) {
	for _, tc := range []struct {
		name             string
		idLen            int
		age              int64
		inputs, writes   int
		nonceLen, resLen int
	}{
		{"short ids, absent inputs", 4, -1, 300, 50, 32, 10},
		{"long ids, absent inputs", 128, -1, 200, 40, 128, 0},
		{"long ids, old present inputs", 128, 1 << 62, 200, 40, 128, 1000},
		{"no inputs, many writes", 128, 0, 0, 2000, 128, 64 << 10},
		{"one write", 1, 0, 1, 1, 1, 1},
	} {
		id := func(prefix string, i int) string {
			s := fmt.Sprintf("%s%d-", prefix, i)
			return s + strings.Repeat("x", max(0, tc.idLen-len(s)))
		}
		req := &ledger.Request{Nonce: strings.Repeat("n", tc.nonceLen), ContractID: strings.Repeat("c", 128)}
		result := bytes.Repeat([]byte("r"), tc.resLen)
		input := map[string]int64{}
		for i := range tc.inputs {
			input[id("in", i)] = tc.age
		}
		writes := map[string]int64{}
		res := &ledger.Result{Receipt: ledger.Receipt{Nonce: req.Nonce, Contract: req.ContractID, Input: input, Writes: writes,
			Result: result, Signature: make([]byte, 72)}}
		for i := range tc.writes {
			w := id("out", i)
			writes[w] = 1<<63 - 1
			res.Proofs = append(res.Proofs, ledger.Proof{ID: w, Age: 1<<63 - 1, Nonce: req.Nonce, Input: input,
				Hash: make([]byte, 32), PrevHash: make([]byte, 32), Signature: make([]byte, 72)})
		}
		size := proto.Size(ResultToAPI(res))
		if bound := ledger.ReplyBound(req, result, input, writes); bound < size {
			t.Errorf("%s: bound %d bytes, reply %d", tc.name, bound, size)
		}
	}
}

// TestVersionEncodedBound: the bounds History adds up to keep a reply
// within its budget are at least the encoded size of the reply, for
// empty and long fields (a 3 MiB value takes a 4-byte length), absent and
// present inputs, and the largest ages and key versions.
func TestVersionEncodedBound(t *testing.T) {
	long := func(n int) []byte { return bytes.Repeat([]byte("v"), n) }
	var vs []*ledger.Version
	for i, tc := range []struct {
		fields, value, inputs int
		age                   int64
	}{
		{0, 0, 0, 0},
		{1, 1, 1, -1},
		{200, 64 << 10, 300, 1<<63 - 1},
		{128, 3 << 20, 5, -1},
	} {
		in := map[string]int64{}
		for j := range tc.inputs {
			in[fmt.Sprintf("in%d-%s", j, long(tc.fields))] = tc.age
		}
		f := string(long(tc.fields))
		vs = append(vs, &ledger.Version{ID: f, Age: 1<<63 - 1, Input: in, Output: long(tc.value), Contract: f,
			Argument: long(tc.value), Nonce: f, Entity: f, KeyVersion: 1<<32 - 1, Signature: long(72), PrevHash: long(32),
			Hash: long(32), ProofSignature: long(72)})
		if i == 0 {
			vs[0].Signature, vs[0].PrevHash, vs[0].Hash, vs[0].ProofSignature = nil, nil, nil, nil
		}
	}
	for n := 1; n <= len(vs); n++ {
		reply := &api.GetAssetReply{Limit: 1<<31 - 1, Truncated: true}
		bound := 6 + 2 // the reply's limit and truncated flag (historyReplyOverhead)
		for _, v := range vs[:n] {
			reply.Versions = append(reply.Versions, VersionToAPI(v))
			bound += ledger.EncodedBound(v)
		}
		if size := proto.Size(reply); bound < size {
			t.Errorf("%d versions: bound %d bytes, reply %d", n, bound, size)
		}
	}
}

// TestAuditorRecordsRoundTrip: tokens, approvals, aborts and Byzantine
// faults come back from the wire as they went.
func TestAuditorRecordsRoundTrip(t *testing.T) {
	tok := &proof.OrderToken{Nonce: "n", Digest: []byte{1, 2}, Deadline: 1234, Signature: []byte{3}}
	if got := OrderTokenFromAPI(OrderTokenToAPI(tok)); !reflect.DeepEqual(got, tok) {
		t.Errorf("token %+v came back %+v", tok, got)
	}
	if OrderTokenToAPI(nil) != nil || OrderTokenFromAPI(nil) != nil {
		t.Error("no token is not nil on the wire")
	}
	ap := &proof.Approval{Nonce: "n", Digest: []byte{4}, Signature: []byte{5}}
	if got := ApprovalFromAPI(ApprovalToAPI(ap)); !reflect.DeepEqual(got, ap) {
		t.Errorf("approval %+v came back %+v", ap, got)
	}
	ab := &proof.AbortRequest{Nonce: "n", Reason: "lease", Deadline: 99, Signature: []byte{6}}
	if got := AbortFromAPI(AbortToAPI(ab)); !reflect.DeepEqual(got, ab) {
		t.Errorf("abort %+v came back %+v", ab, got)
	}
	for _, f := range []*proof.ByzantineFault{
		{Nonce: "n", Asset: "a/1", Age: 7, Check: "hash", Detail: "the ledger's version hashes to 01, the Auditor's to 02"},
		{Nonce: "n", Age: 0, Check: "result", Detail: "résumé"},
	} {
		if got := FaultFromTrailer(f.Nonce, f.Detail, FaultTrailer(f)); !reflect.DeepEqual(got, f) {
			t.Errorf("fault %+v came back %+v", f, got)
		}
	}
	if md := FaultTrailer(&proof.ByzantineFault{Asset: "é"}); len(md.Get(FaultAssetKey)) != 0 {
		t.Error("an asset id that is not printable ASCII went into a header")
	}
	if Code("byzantine_fault") != codes.DataLoss || Code("not_ordered") != codes.FailedPrecondition || Code("not_auditor") != codes.PermissionDenied {
		t.Error("the Auditor's kinds have other codes than documented")
	}
}
