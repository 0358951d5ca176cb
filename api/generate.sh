#!/usr/bin/env bash
# Regenerates the Go code of kiroku.proto and transport.proto. Needs protoc
# (Debian: protobuf-compiler) and the two plugins at the versions go.mod
# pins:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
set -euo pipefail
cd "$(dirname "$0")"
for proto in kiroku.proto transport.proto; do
  protoc --go_out=. --go_opt=paths=source_relative \
    --go-grpc_out=. --go-grpc_opt=paths=source_relative "$proto"
done
