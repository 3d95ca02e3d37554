package stream

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/usherhq/usher/internal/entry"
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

// BandKey is the key of shard's band for jobs of priority p
// (entry.HighestPriority to entry.LowestPriority): the shard's key itself
// for entry.DefaultPriority, so a deployment that never names a priority
// keeps the keys it always had, and shard+":p"+p in the shard's hash
// slot for the others. A shard's bands share its slot so that one read
// script takes them in priority order (readScript's "read" mode).
func BandKey(shard string, p int) string {
	if p == entry.DefaultPriority {
		return shard
	}
	return slotPrefix(shard) + fmt.Sprintf(":p%d", p)
}

// BandKeys are shard's band keys, highest priority first.
func BandKeys(shard string) []string {
	keys := make([]string, 0, entry.LowestPriority)
	for p := entry.HighestPriority; p <= entry.LowestPriority; p++ {
		keys = append(keys, BandKey(shard, p))
	}
	return keys
}

// Keys are every key the first n shards of base hold entries in: each
// shard's bands, shard by shard. What is done to every entry wherever it
// waits (reclaim, trim, the reconciler's window, a dead host's claim,
// inspect) is done on each of them.
func Keys(base string, n int) []string {
	var keys []string
	for _, shard := range ShardKeys(base, n) {
		keys = append(keys, BandKeys(shard)...)
	}
	return keys
}

// slotPrefix is key when it has a hash tag, else key as one: a key made
// by appending to it is in key's hash slot (a key without a tag hashes
// whole, so "{key}..." lands in its slot).
func slotPrefix(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key
		}
	}
	return "{" + key + "}"
}
