// Package api holds kiroku's protobuf definitions (kiroku.proto), the Go
// code protoc generates from them (generate.sh), and the HTTP/2 transport
// settings the client and the server share (transport.go).
package api
