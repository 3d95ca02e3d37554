// Package store keeps blobs under keys a handler derives from its job.
package store

import (
	"context"
	"os"
	"path/filepath"
)

// Dir is a directory of blobs.
type Dir string

// Put writes data under key; a second Put of the same key and bytes
// changes nothing.
//
//usher:idempotent-by-key
func (d Dir) Put(ctx context.Context, key string, data []byte) error { // want Put:`keyed: effect idempotent by key //usher:idempotent-by-key`
	return os.WriteFile(filepath.Join(string(d), key), data, 0o600)
}

// Get reads the blob under key: reading is no effect.
func (d Dir) Get(ctx context.Context, key string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), key))
}
