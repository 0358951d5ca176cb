package client

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/wire"
)

// TestConflictSentinel: ABORTED with the kind "conflict" is ErrConflict,
// which callers test for to send the same request again.
func TestConflictSentinel(t *testing.T) {
	err := fromStatus(status.Error(codes.Aborted, "retries exhausted"), metadata.Pairs(wire.ErrorKindKey, wire.KindConflict))
	var ce *Error
	if !errors.Is(err, ErrConflict) || !errors.As(err, &ce) || ce.Kind != wire.KindConflict || ce.Code != codes.Aborted {
		t.Fatalf("fromStatus: %#v", err)
	}
	if err := fromStatus(status.Error(codes.Aborted, "x"), nil); errors.Is(err, ErrConflict) {
		t.Fatal("a bare ABORTED is not a conflict the server vouches for")
	}
}
