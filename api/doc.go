// Package api holds kiroku's protobuf definitions — the ledger's API
// (kiroku.proto) and the node-to-node service of package transport's gRPC
// implementation (transport.proto) — the Go code protoc generates from them
// (generate.sh), and the HTTP/2 transport settings the client and the
// server share (transport.go).
package api
