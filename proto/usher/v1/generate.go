// Package usherv1 holds the generated protobuf and gRPC code of the
// host-plugin contract. Regenerate with `make generate`.
package usherv1

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative usher.proto
