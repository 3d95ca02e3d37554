package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultReplicaTimeout is how long a relay with RelayConfig.Replicas set
// waits for the replicas' acknowledgement of a batch (WAIT's timeout).
const DefaultReplicaTimeout = time.Second

// publish adds the batch's entries to the stream in one pipeline and,
// with Replicas set, ends it with WAIT Replicas ReplicaTimeout on the same
// connection: the batch counts as published only when that many replicas
// have acknowledged every entry, so a failover of the primary right after
// the mark cannot drop an entry whose row says it was published. On a
// cluster the pipeline goes to the primary serving the stream's slot
// (WAIT has no key, and must run on the connection that wrote).
func (r *Relay) publish(ctx context.Context, values [][]any) error {
	var client redis.Cmdable = r.cfg.Redis
	cc, cluster := r.cfg.Redis.(*redis.ClusterClient)
	if cluster && r.cfg.Replicas > 0 {
		node, err := cc.MasterForKey(ctx, r.cfg.Stream)
		if err != nil {
			return err
		}
		client = node
	}
	pipe := client.Pipeline()
	for _, v := range values {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: r.cfg.Stream, Values: v})
	}
	var wait *redis.Cmd
	if r.cfg.Replicas > 0 {
		wait = pipe.Do(ctx, "WAIT", r.cfg.Replicas, r.cfg.ReplicaTimeout.Milliseconds())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		if cluster && r.cfg.Replicas > 0 {
			cc.ReloadState(ctx) // the primary moved (MOVED) or died: ask again
		}
		return err
	}
	if wait != nil {
		if n, err := wait.Int64(); err != nil || n < int64(r.cfg.Replicas) {
			return fmt.Errorf("%d of %d replicas acknowledged the batch within %s", n, r.cfg.Replicas, r.cfg.ReplicaTimeout)
		}
	}
	return nil
}
