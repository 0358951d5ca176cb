package server

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
)

// TestMissingAssetIsNotFound: GetAsset and GetProof agree on an asset that
// does not exist, NOT_FOUND with the kind not_found (GetAsset answered OK
// and an empty history); a range of an existing asset that holds no
// version is an empty history, not an error.
func TestMissingAssetIsNotFound(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, Options{AdminToken: "admin-token"})
	c := secretClient(t, srv, "nf", "admin-token")
	if _, err := c.Execute(ctx, "builtin.bulk_load", []byte(`{"prefix":"a","first":0,"count":1,"payload":"x"}`)); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"GetAsset": func() error { _, err := c.History(ctx, "nope", ledger.ScanRange{End: -1}); return err },
		"GetProof": func() error { _, err := c.Proof(ctx, "nope", 0); return err },
	} {
		err := call()
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != codes.NotFound || !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("%s of a missing asset: %v; want NOT_FOUND, not_found", name, err)
		}
	}
	if vs, err := c.History(ctx, "a0", ledger.ScanRange{Start: 5, End: -1}); err != nil || len(vs) != 0 {
		t.Errorf("a range past an asset's latest version: %d versions, %v; want none and no error", len(vs), err)
	}
	if vs, err := c.History(ctx, "a0", ledger.ScanRange{End: -1}); err != nil || len(vs) != 1 {
		t.Errorf("an existing asset: %d versions, %v", len(vs), err)
	}
}
