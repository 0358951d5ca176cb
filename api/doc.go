// Package api holds kiroku's protobuf definitions (kiroku.proto) and the Go
// code protoc generates from them (generate.sh). Nothing else lives here.
package api
