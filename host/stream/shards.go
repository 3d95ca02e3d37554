package stream

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// MaxShards bounds a stream's shards: each is read by every host, so an
// idle host polls each in turn.
const MaxShards = 256

// ShardKey is the key of shard i of the stream whose base key is base.
// Shard 0 is base itself, so a deployment of one shard keeps the key it
// always had. Shard i > 0 puts "-i" inside base's hash tag (usher:{jobs}
// becomes usher:{jobs-1}), so that each shard has a slot of its own and
// Redis Cluster spreads them over its primaries, while every key derived
// from a shard (its leases, its entries' crash counts) stays in its
// slot. A base without a tag gets "-i" at its end.
func ShardKey(base string, i int) string {
	if i == 0 {
		return base
	}
	if l := strings.IndexByte(base, '{'); l >= 0 {
		if r := strings.IndexByte(base[l+1:], '}'); r > 0 {
			r += l + 1
			return fmt.Sprintf("%s-%d%s", base[:r], i, base[r:])
		}
	}
	return fmt.Sprintf("%s-%d", base, i)
}

// ShardKeys are the keys of the first n shards of base.
func ShardKeys(base string, n int) []string {
	keys := make([]string, max(n, 1))
	for i := range keys {
		keys[i] = ShardKey(base, i)
	}
	return keys
}

// ShardOf is the shard, of n, that the relay adds job jobID's entries to:
// FNV-1a of the job's identity, modulo n. A job's every entry (a relay
// duplicate, a retry, a requeue) lands on one shard, and jobs spread
// evenly whatever their kind or request.
func ShardOf(jobID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(jobID))
	return int(h.Sum32() % uint32(n))
}
