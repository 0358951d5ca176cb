package grpcnet

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/transport"
)

// The request metadata every RPC carries.
const (
	mdCluster = "kiroku-cluster"
	mdFrom    = "kiroku-from"
	mdTo      = "kiroku-to"
	// mdAccepted is the response header with which the server accepts a
	// Messages stream.
	mdAccepted = "kiroku-accepted"
)

// errorDomain is the domain of the google.rpc.ErrorInfo detail a refusal's
// status carries; its reason names the refusal.
const errorDomain = "transport.kiroku"

// Refusal reasons, and the handler's error.
const (
	reasonWrongCluster = "WRONG_CLUSTER"
	reasonUnknownPeer  = "UNKNOWN_PEER"
	reasonWrongNode    = "WRONG_NODE"
	reasonTooLarge     = "TOO_LARGE"
	reasonClosed       = "CLOSED"
	reasonRemote       = "REMOTE"
)

var reasons = []struct {
	reason string
	err    error
	code   codes.Code
}{
	{reasonWrongCluster, transport.ErrWrongCluster, codes.PermissionDenied},
	{reasonUnknownPeer, transport.ErrUnknownPeer, codes.PermissionDenied},
	{reasonWrongNode, transport.ErrWrongNode, codes.FailedPrecondition},
	{reasonTooLarge, transport.ErrTooLarge, codes.ResourceExhausted},
	{reasonClosed, transport.ErrClosed, codes.Unavailable},
}

// toStatus is the status that carries err, a refusal (one of the sentinels
// of reasons) or a handler's error, to the peer.
func toStatus(err error) error {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return withReason(r.code, r.reason, err.Error())
		}
	}
	return withReason(codes.Unknown, reasonRemote, err.Error())
}

func withReason(code codes.Code, reason, msg string) error {
	st, derr := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Domain: errorDomain, Reason: reason})
	if derr != nil {
		panic(derr) // marshalling an ErrorInfo cannot fail
	}
	return st.Err()
}

// fromStatus turns the error of an RPC to peer into the transport's error:
// a *RemoteError for what the peer's transport or handler said,
// ErrUnreachable wrapping anything else, and ctx's error if the caller's
// context ended. closing reports whether the transport is closing.
func fromStatus(ctx context.Context, closing bool, peer transport.NodeID, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if closing {
		return transport.ErrClosed
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%w: peer %d: %w", transport.ErrUnreachable, peer, err)
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.Domain != errorDomain {
			continue
		}
		if info.Reason == reasonRemote {
			return &transport.RemoteError{Peer: peer, Msg: st.Message()}
		}
		for _, r := range reasons {
			if r.reason == info.Reason {
				return &transport.RemoteError{Peer: peer, Msg: st.Message(), Refusal: r.err}
			}
		}
	}
	if st.Code() == codes.ResourceExhausted {
		// The peer's gRPC server refused a message over its MaxRecvMsgSize.
		return &transport.RemoteError{Peer: peer, Msg: st.Message(), Refusal: transport.ErrTooLarge}
	}
	return fmt.Errorf("%w: peer %d: %w", transport.ErrUnreachable, peer, err)
}

// admit checks the metadata of an incoming RPC and returns the sender's
// node id, or the refusal.
func (t *Transport) admit(ctx context.Context) (transport.NodeID, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	one := func(key string) string {
		if v := md.Get(key); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if c := one(mdCluster); c != t.cfg.ClusterID {
		return 0, fmt.Errorf("%w: node %d is in cluster %q, not %q", transport.ErrWrongCluster, t.cfg.NodeID,
			t.cfg.ClusterID, c)
	}
	from, err := strconv.ParseUint(one(mdFrom), 10, 64)
	if err != nil || t.inboundOf(transport.NodeID(from)) == nil {
		return 0, fmt.Errorf("%w: node %d does not know node %q", transport.ErrUnknownPeer, t.cfg.NodeID, one(mdFrom))
	}
	if to := one(mdTo); to != strconv.FormatUint(uint64(t.cfg.NodeID), 10) {
		return 0, fmt.Errorf("%w: node %d got traffic for node %q", transport.ErrWrongNode, t.cfg.NodeID, to)
	}
	return transport.NodeID(from), nil
}

// outgoing adds the metadata of traffic to peer to ctx.
func (t *Transport) outgoing(ctx context.Context, to transport.NodeID) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdCluster, t.cfg.ClusterID,
		mdFrom, strconv.FormatUint(uint64(t.cfg.NodeID), 10), mdTo, strconv.FormatUint(uint64(to), 10))
}
