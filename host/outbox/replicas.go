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

// publish adds the batch's entries, values[i] to shard keys[i], in one
// pipeline (a cluster client sends each shard's to its primary) and, with
// Replicas set, ends it with WAIT Replicas ReplicaTimeout on the same
// connection: the batch counts as published only when that many replicas
// have acknowledged every entry, so a failover of the primary right after
// the mark cannot drop an entry whose row says it was published. On a
// cluster with Replicas set each shard's entries go in a pipeline of their
// own to the primary serving the shard's slot (WAIT has no key, and must
// run on the connection that wrote).
func (r *Relay) publish(ctx context.Context, keys []string, values [][]any) error {
	cc, cluster := r.cfg.Redis.(*redis.ClusterClient)
	if !cluster || r.cfg.Replicas == 0 {
		return r.publishOn(ctx, r.cfg.Redis, keys, values)
	}
	byShard := map[string][]int{}
	for i, k := range keys {
		byShard[k] = append(byShard[k], i)
	}
	for shard, at := range byShard {
		node, err := cc.MasterForKey(ctx, shard)
		if err != nil {
			return err
		}
		ks, vs := make([]string, len(at)), make([][]any, len(at))
		for j, i := range at {
			ks[j], vs[j] = keys[i], values[i]
		}
		if err := r.publishOn(ctx, node, ks, vs); err != nil {
			cc.ReloadState(ctx) // the primary moved (MOVED) or died: ask again
			return err
		}
	}
	return nil
}

// publishOn is publish's pipeline on one client.
func (r *Relay) publishOn(ctx context.Context, client redis.Cmdable, keys []string, values [][]any) error {
	pipe := client.Pipeline()
	for i, v := range values {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: keys[i], Values: v})
	}
	var wait *redis.Cmd
	if r.cfg.Replicas > 0 {
		wait = pipe.Do(ctx, "WAIT", r.cfg.Replicas, r.cfg.ReplicaTimeout.Milliseconds())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if wait != nil {
		if n, err := wait.Int64(); err != nil || n < int64(r.cfg.Replicas) {
			return fmt.Errorf("%d of %d replicas acknowledged the batch within %s", n, r.cfg.Replicas, r.cfg.ReplicaTimeout)
		}
	}
	return nil
}
