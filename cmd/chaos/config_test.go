package main

import (
	"bytes"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Redis mode decides the shards' default and which Redis fault is
// injected; a value outside its range, or a fault of the other mode, is
// refused with the reason.
func TestParseConfigRedisMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		args    []string
		cluster bool
		shards  int
		faults  []faultKind // must be in the list
		absent  []faultKind // must not be
		err     string      // a part of the error, when one is wanted
	}{
		{name: "single node by default", shards: 1,
			faults: []faultKind{faultRedisRestart, faultHostKill}, absent: []faultKind{faultRedisFailover}},
		{name: "cluster", args: []string{"--redis-cluster"}, cluster: true, shards: 6,
			faults: []faultKind{faultRedisFailover, faultHostKill}, absent: []faultKind{faultRedisRestart}},
		{name: "cluster with its shards", args: []string{"--redis-cluster", "--stream-shards", "3"}, cluster: true, shards: 3},
		{name: "single node with shards", args: []string{"--stream-shards", "256"}, shards: 256},
		{name: "cluster short", args: []string{"--redis-cluster", "--short"}, cluster: true, shards: 6},
		{name: "failover named", args: []string{"--redis-cluster", "--faults", "redis-failover,relay-dup"}, cluster: true, shards: 6,
			faults: []faultKind{faultRedisFailover, faultRelayDuplicate}, absent: []faultKind{faultRedisRestart, faultHostKill}},
		{name: "restart named", args: []string{"--faults", "redis-restart"}, shards: 1, faults: []faultKind{faultRedisRestart}},
		{name: "no shard", args: []string{"--stream-shards", "0"}, err: "--stream-shards 0 is outside 1-256"},
		{name: "too many shards", args: []string{"--redis-cluster", "--stream-shards", "257"}, err: "--stream-shards 257 is outside 1-256"},
		{name: "restart in cluster mode", args: []string{"--redis-cluster", "--faults", "host-kill,redis-restart"},
			err: "fault redis-restart applies to the single Redis node, not to --redis-cluster"},
		{name: "failover without the cluster", args: []string{"--faults", "redis-failover"},
			err: "fault redis-failover needs --redis-cluster"},
		{name: "aof in cluster mode", args: []string{"--redis-cluster", "--redis-aof=false"}, err: "--redis-aof is the single Redis node's"},
		{name: "unknown fault", args: []string{"--faults", "redis-explode"}, err: `unknown fault type "redis-explode"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := parseConfig(tc.args, io.Discard)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.cluster, cfg.redisCluster)
			require.Equal(t, tc.shards, cfg.streamShards)
			for _, k := range tc.faults {
				require.Contains(t, cfg.faults, k)
			}
			for _, k := range tc.absent {
				require.NotContains(t, cfg.faults, k)
			}
			for _, k := range cfg.faults {
				require.True(t, k.appliesTo(cfg.redisCluster), "%s in the faults of cluster=%v", k, cfg.redisCluster)
			}
		})
	}
}

// The help names the mode of each fault that applies to one only.
func TestParseConfigHelpNamesModes(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, err := parseConfig([]string{"-h"}, &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	help := strings.Join(strings.Fields(out.String()), " ")
	require.Contains(t, help, "redis-restart (single node only)")
	require.Contains(t, help, "redis-failover (--redis-cluster only)")
	require.Contains(t, help, "-redis-cluster")
	require.Contains(t, help, "-stream-shards")
}

// A run's replay command parses back into its Redis mode, shards and
// faults.
func TestReplayCommandKeepsRedisMode(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--redis-cluster", "--short", "--seed", "7"},
		{"--redis-cluster", "--stream-shards", "4", "--faults", "redis-failover,host-stop", "--seed", "8"},
		{"--stream-shards", "2", "--seed", "9"},
	} {
		cfg, err := parseConfig(args, io.Discard)
		require.NoError(t, err)
		replay := strings.Fields((&chaos{cfg: cfg}).replayCommand())
		again, err := parseConfig(replay[1:], io.Discard)
		require.NoError(t, err, "replay %v", replay)
		require.Equal(t, cfg.redisCluster, again.redisCluster, "replay %v", replay)
		require.Equal(t, cfg.streamShards, again.streamShards, "replay %v", replay)
		require.Equal(t, cfg.seed, again.seed, "replay %v", replay)
		require.True(t, slices.Equal(cfg.faults, again.faults), "replay %v: %v, then %v", replay, cfg.faults, again.faults)
	}
}
