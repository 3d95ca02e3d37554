package hosttest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/internal/localcluster"
)

// RedisCluster is a Redis Cluster of the test's own (localcluster's: 3
// primaries with a replica each, on free loopback ports, from the
// machine's redis-server, in a temporary directory), stopped when the test
// ends. Its methods fail the test where localcluster's return an error.
type RedisCluster struct {
	tb      testing.TB
	cluster *localcluster.Cluster
}

// NodeTimeout is the cluster-node-timeout the test clusters run with: a
// primary unreachable this long is failed over to its replica.
const NodeTimeout = localcluster.NodeTimeout

// StartRedisCluster starts the six nodes, joins them with
// `redis-cli --cluster create ... --cluster-replicas 1` and waits until
// every node reports cluster_state:ok.
func StartRedisCluster(tb testing.TB) *RedisCluster {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			tb.Fatalf("hosttest: %s not found (Debian's redis-server package has it): %v", bin, err)
		}
	}
	cluster, err := localcluster.Start(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	c := &RedisCluster{tb: tb, cluster: cluster}
	tb.Cleanup(c.stop)
	return c
}

// stop stops the nodes and, when the test failed, logs the end of each
// node's log.
func (c *RedisCluster) stop() {
	c.cluster.Stop()
	if !c.tb.Failed() {
		return
	}
	for _, a := range c.cluster.Addrs() {
		log, _ := os.ReadFile(filepath.Join(c.cluster.Dir(a), "redis.log"))
		if len(log) > 4000 {
			log = log[len(log)-4000:]
		}
		c.tb.Logf("redis cluster node %s's log ends:\n%s", a, log)
	}
}

// Addrs are the nodes' addresses, host:port.
func (c *RedisCluster) Addrs() []string { return c.cluster.Addrs() }

// URL is the redis-cluster:// URL naming addrs as seeds (all nodes when
// none are given).
func (c *RedisCluster) URL(addrs ...string) string {
	if len(addrs) == 0 {
		return c.cluster.URL()
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}

// Client is a cluster client for the test (closed when it ends).
func (c *RedisCluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: time.Second})
	c.tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// PrimaryFor is the address of the primary that serves key's slot, as the
// first live node that answers sees it (during a failover, the nodes may
// disagree for a while; a test polling for the promotion wants any one).
func (c *RedisCluster) PrimaryFor(key string) string {
	c.tb.Helper()
	for _, a := range c.cluster.LiveAddrs() {
		if p, err := localcluster.PrimarySeenBy(context.Background(), a, key); err == nil {
			return p
		}
	}
	c.tb.Fatalf("hosttest: no live node knows who serves %q", key)
	return ""
}

// NotServing is the address of a live primary that does not serve key's
// slot: a client pointed at it is answered MOVED.
func (c *RedisCluster) NotServing(key string) string {
	c.tb.Helper()
	owner := c.PrimaryFor(key)
	for _, a := range c.cluster.LiveAddrs() {
		cl := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		role, err := cl.Do(context.Background(), "ROLE").Slice()
		_ = cl.Close()
		if err == nil && len(role) > 0 && role[0] == "master" && a != owner {
			return a
		}
	}
	c.tb.Fatal("hosttest: no other live primary")
	return ""
}

// Kill sends SIGKILL to the node at addr and waits for it to exit.
func (c *RedisCluster) Kill(addr string) {
	c.tb.Helper()
	if err := c.cluster.Kill(addr); err != nil {
		c.tb.Fatal(err)
	}
}

// Restart starts the node at addr again after Kill: it rejoins with its
// nodes.conf, as a replica if it was failed over meanwhile.
func (c *RedisCluster) Restart(addr string) {
	c.tb.Helper()
	if err := c.cluster.Restart(addr); err != nil {
		c.tb.Fatal(err)
	}
}

// WaitHealthy waits until every live node reports cluster_state:ok and
// agrees every slot is served, and every live replica is in sync with its
// primary.
func (c *RedisCluster) WaitHealthy(within time.Duration) {
	c.tb.Helper()
	if err := c.cluster.WaitHealthy(within); err != nil {
		c.tb.Fatal(err)
	}
}
