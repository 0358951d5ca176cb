package api

// StreamWindow and ConnWindow are the HTTP/2 flow-control windows, per
// stream and per connection, that the server and the Go SDK both set. A
// static window turns off gRPC's bandwidth-delay estimator, which
// otherwise answers the first DATA frame after each of its pings with a
// new ping, so that a call at low or moderate load costs two PING frames
// and two PING acks on top of its request and reply: four more write
// system calls, each of which on loopback costs the sender the
// receiver's TCP processing too. The estimator never grows a window
// beyond 16 MiB per connection; these windows match that, so a large
// reply is no slower on a long link than under the estimator once it has
// converged (4 MiB per stream is 40 MB/s at a 100 ms round trip).
const (
	StreamWindow = 4 << 20
	ConnWindow   = 16 << 20
)
