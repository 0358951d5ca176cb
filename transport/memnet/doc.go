// Package memnet is a deterministic, fault-injecting in-memory network
// that implements transport.Transport for tests and the simulator.
//
// Nodes join a Network with a Handler and get an Endpoint. Every packet —
// a message of Send, a Call's request or reply, a SendStream's payload or
// result — gets its fate when it is sent: lost, or due at a time drawn
// from the link's Faults on the network's clock (and perhaps duplicated).
// No goroutine moves anything: Step delivers what is due at the clock's
// current time, in order of due time and then of sending, calling handlers
// synchronously; RunFor moves a fake clock from due time to due time. All
// randomness comes from one PCG source seeded by Config.Seed, so the same
// seed and the same calls, in the same order, give the same trace
// (Config.Trace) byte for byte.
//
// Faults are network-wide (Config.Faults, SetFaults) or per one-way link
// (SetLinkFaults): Drop, Duplicate, a delay range, Reorder. Cut,
// CutOneWay, Partition, Heal and HealAll cut and restore links: a packet
// is lost if its link is cut when it is sent or when it falls due. A
// closed Endpoint is a node down: packets for it are lost until it joins
// again. Any node id but 0 and the sender's own is a valid destination,
// joined or not: the network has no membership.
//
// Handlers run inside Step: they may send (what they send is delivered by
// a later Step), but they must not wait for the network, e.g. with a
// blocking Call. A simulator that runs on one goroutine uses StartCall and
// StartStream, whose completions also run inside Step; Call and SendStream
// block and need another goroutine to step the network. A Call whose
// request or reply is lost fails with ErrTimeout when Config.CallTimeout
// has passed on the network's clock; a duplicated request runs Serve twice,
// and the first reply wins.
package memnet
