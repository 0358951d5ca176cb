package memnet

import (
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/transport"
)

// Faults are what a link does to the packets that cross it. A packet is a
// message of Send, a Call's request or reply, or a SendStream's payload or
// result. The zero value is a perfect link: no loss, no delay, send order.
type Faults struct {
	// Drop is the probability, in [0, 1], that a packet is lost.
	Drop float64
	// Duplicate is the probability, in [0, 1], that a packet that is not
	// lost is delivered a second time. The copy gets its own delay, drawn
	// anew from [DelayMin, DelayMax], outside the link's order: it may
	// arrive before or after later packets.
	Duplicate float64
	// DelayMin and DelayMax bound a packet's latency on the network's
	// clock: each packet's is drawn uniformly from [DelayMin, DelayMax]
	// (nanosecond grain). Without Reorder, a packet is also held until the
	// one sent before it on the same link is due, so delays never reorder.
	DelayMin, DelayMax time.Duration
	// Reorder is the probability, in [0, 1], that a packet leaves the
	// link's order: it is delayed by a further (0, ReorderDelay] beyond its
	// latency, and packets sent after it are not held behind it, so they
	// can overtake it.
	Reorder float64
	// ReorderDelay bounds the extra delay of a reordered packet. 0 means
	// 10 ms when Reorder > 0.
	ReorderDelay time.Duration
}

// Validate rejects probabilities outside [0, 1] and negative or inverted
// delays, and fills ReorderDelay's default.
func (f *Faults) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"Drop", f.Drop}, {"Duplicate", f.Duplicate}, {"Reorder", f.Reorder}} {
		if !(p.v >= 0 && p.v <= 1) { // also rejects NaN
			return fmt.Errorf("%w: memnet: Faults.%s = %v, not in [0, 1]", transport.ErrConfig, p.name, p.v)
		}
	}
	if f.DelayMin < 0 || f.DelayMax < f.DelayMin {
		return fmt.Errorf("%w: memnet: delay range [%v, %v]", transport.ErrConfig, f.DelayMin, f.DelayMax)
	}
	if f.ReorderDelay < 0 {
		return fmt.Errorf("%w: memnet: negative ReorderDelay", transport.ErrConfig)
	}
	if f.Reorder > 0 && f.ReorderDelay == 0 {
		f.ReorderDelay = 10 * time.Millisecond
	}
	return nil
}

// Config configures a Network.
type Config struct {
	// Seed seeds the network's one random source (PCG): the same seed and
	// the same calls give the same trace.
	Seed uint64
	// Clock gives every packet its delivery time and Step its "now". nil
	// means a new fake clock set to Epoch, which the caller advances
	// (Network.Clock, RunFor). A real clock works but is not deterministic.
	Clock clockwork.Clock
	// Faults apply to every link that has none of its own (SetLinkFaults).
	Faults Faults
	// QueueBytes bounds, per link, the bytes of Send messages in flight
	// (sent, neither delivered nor lost yet); Send returns
	// ErrBackpressure beyond it. 0 means 64 MiB.
	QueueBytes int
	// ChunkBytes bounds what one Read of a ReceiveStream's reader returns,
	// in bytes. 0 means 64 KiB.
	ChunkBytes int
	// MaxStreamBytes bounds a SendStream's payload, which the in-memory
	// network holds whole; a larger one fails with ErrTooLarge. 0 means
	// 1 GiB.
	MaxStreamBytes int64
	// CallTimeout is how long, on Clock, a Call or SendStream waits for its
	// reply before failing with ErrTimeout (its request or reply was lost,
	// or the peer is down). 0 means 10 s.
	CallTimeout time.Duration
	// Trace, if set, is called with every event, under the network's lock
	// and in order: it must not call back into the network.
	Trace func(Event)
}

// Epoch is the time a default fake clock starts at.
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Validate rejects a bad configuration and fills defaults.
func (c *Config) Validate() error {
	if c.QueueBytes < 0 || c.ChunkBytes < 0 || c.MaxStreamBytes < 0 || c.CallTimeout < 0 {
		return fmt.Errorf("%w: memnet: negative QueueBytes, ChunkBytes, MaxStreamBytes or CallTimeout", transport.ErrConfig)
	}
	if err := c.Faults.Validate(); err != nil {
		return err
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewFakeClockAt(Epoch)
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = 64 << 20
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = 64 << 10
	}
	if c.MaxStreamBytes == 0 {
		c.MaxStreamBytes = 1 << 30
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 10 * time.Second
	}
	return nil
}
