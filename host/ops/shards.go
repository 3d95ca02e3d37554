package ops

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/stream"
)

// RecordShards records that a host publishes to n shards of the stream
// whose base key is base, and returns how many shards every host must
// read: the most any host has recorded (the stream_shards table). A host
// started with fewer shards than before still reads the ones it no longer
// publishes to, so their entries are not stranded.
func RecordShards(ctx context.Context, q outbox.Querier, base string, n int) (int, error) {
	if n < 1 || n > stream.MaxShards {
		return 0, fmt.Errorf("stream shards %d: must be between 1 and %d", n, stream.MaxShards)
	}
	var most int
	err := q.QueryRow(ctx, `
		INSERT INTO stream_shards (stream, shards) VALUES ($1, $2)
		ON CONFLICT (stream) DO UPDATE SET shards = greatest(stream_shards.shards, excluded.shards),
			updated_at = CASE WHEN excluded.shards > stream_shards.shards THEN now() ELSE stream_shards.updated_at END
		RETURNING shards`, base, n).Scan(&most)
	if err != nil {
		return 0, fmt.Errorf("record the stream's shards: %w", err)
	}
	return most, nil
}

// Shards is how many shards of base the hosts read: the most recorded, 1
// when no host has recorded any.
func Shards(ctx context.Context, q outbox.Querier, base string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT shards FROM stream_shards WHERE stream = $1`, base).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the stream's shards: %w", err)
	}
	return n, nil
}
