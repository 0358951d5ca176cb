package memnet

import (
	"fmt"
	"time"

	"github.com/kiroku-db/kiroku/transport"
)

// Kind is what happened to a packet.
type Kind uint8

const (
	// Sent: the packet was put on its link, due at Event.Due.
	Sent Kind = iota + 1
	// Duplicated: a copy (Event.ID) of packet Event.Of was put on the link.
	Duplicated
	// Dropped: the packet was lost; Event.Reason says why: "fault" (the
	// link's Drop), "cut" (a partition, at send or at delivery), "down"
	// (no node, or a closed one, at the destination).
	Dropped
	// Delivered: the packet was handed to the destination's Handler, or a
	// reply or result to the caller.
	Delivered
	// Stale: a reply or result arrived for a call that had already ended
	// (timed out, cancelled, or answered by a duplicate).
	Stale
	// TimedOut: a call or stream got no reply within CallTimeout.
	TimedOut
)

func (k Kind) String() string {
	switch k {
	case Sent:
		return "send"
	case Duplicated:
		return "dup"
	case Dropped:
		return "drop"
	case Delivered:
		return "deliver"
	case Stale:
		return "stale"
	case TimedOut:
		return "timeout"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Traffic is the kind of packet.
type Traffic uint8

const (
	// Msg is one message of a Send.
	Msg Traffic = iota + 1
	// Request is a Call's request.
	Request
	// Reply is a Call's reply (or its handler's error).
	Reply
	// Stream is a SendStream's whole payload.
	Stream
	// Result is a ReceiveStream's result, back to the sender.
	Result
)

func (t Traffic) String() string {
	switch t {
	case Msg:
		return "msg"
	case Request:
		return "req"
	case Reply:
		return "reply"
	case Stream:
		return "stream"
	case Result:
		return "result"
	}
	return fmt.Sprintf("Traffic(%d)", uint8(t))
}

// Event is one line of the network's trace.
type Event struct {
	// At is the network clock's time when it happened, since the network
	// was made.
	At      time.Duration
	Kind    Kind
	Traffic Traffic
	From    transport.NodeID
	To      transport.NodeID
	// ID names the packet, unique in the network; Of is the original of a
	// duplicate (Duplicated) and 0 otherwise. Call is the call a request,
	// reply, stream or result belongs to.
	ID, Of, Call uint64
	// Due is when a Sent or Duplicated packet is to be delivered, since
	// the network was made.
	Due time.Duration
	// Size is the packet's payload size in bytes.
	Size   int
	Reason string
}

func (e Event) String() string {
	s := fmt.Sprintf("%v %s %s %d->%d #%d size=%d", e.At, e.Kind, e.Traffic, e.From, e.To, e.ID, e.Size)
	if e.Call != 0 {
		s += fmt.Sprintf(" call=%d", e.Call)
	}
	if e.Kind == Sent || e.Kind == Duplicated {
		s += fmt.Sprintf(" due=%v", e.Due)
	}
	if e.Of != 0 {
		s += fmt.Sprintf(" of=#%d", e.Of)
	}
	if e.Reason != "" {
		s += " " + e.Reason
	}
	return s
}
