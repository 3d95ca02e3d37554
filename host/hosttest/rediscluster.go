package hosttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/internal/localcluster"
)

// RedisCluster is a Redis Cluster of the test's own: 3 primaries with a
// replica each, on free loopback ports, started from the machine's
// redis-server (Debian's redis-server package) in a temporary directory,
// and stopped when the test ends.
type RedisCluster struct {
	tb  testing.TB
	dir string
	mu  sync.Mutex
	// nodes by port.
	nodes map[int]*localcluster.Node
	ports []int
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
	c := &RedisCluster{tb: tb, dir: tb.TempDir(), nodes: map[int]*localcluster.Node{}}
	tb.Cleanup(c.stop)
	var err error
	if c.ports, err = localcluster.Ports(localcluster.Nodes); err != nil {
		tb.Fatal(err)
	}
	for _, p := range c.ports {
		c.start(p)
	}
	if err := localcluster.Create(c.ports); err != nil {
		tb.Fatal(err)
	}
	c.WaitHealthy(30 * time.Second)
	return c
}

// start runs the node on port (again, after Kill: it rejoins with its
// nodes.conf, as a replica if it was failed over meanwhile).
func (c *RedisCluster) start(port int) {
	c.tb.Helper()
	n, err := localcluster.StartNode(c.dir, port)
	if err != nil {
		c.tb.Fatal(err)
	}
	c.mu.Lock()
	c.nodes[port] = n
	c.mu.Unlock()
}

func (c *RedisCluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		_ = n.Cmd.Process.Kill()
		<-n.Done
	}
	if c.tb.Failed() {
		for _, p := range c.ports {
			log, _ := os.ReadFile(filepath.Join(c.dir, strconv.Itoa(p), "redis.log"))
			if len(log) > 4000 {
				log = log[len(log)-4000:]
			}
			c.tb.Logf("redis cluster node %d's log ends:\n%s", p, log)
		}
	}
}

// Addrs are the nodes' addresses, host:port.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.ports))
	for i, p := range c.ports {
		out[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return out
}

// URL is the redis-cluster:// URL naming addrs as seeds (all nodes when
// none are given).
func (c *RedisCluster) URL(addrs ...string) string {
	if len(addrs) == 0 {
		addrs = c.Addrs()
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}

// Client is a cluster client for the test (closed when it ends).
func (c *RedisCluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: time.Second})
	c.tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// node is a client of the node at addr alone.
func node(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
}

// PrimaryFor is the address of the primary that serves key's slot, asked
// of a live node.
func (c *RedisCluster) PrimaryFor(key string) string {
	c.tb.Helper()
	slot := slotOf(key)
	for _, a := range c.liveAddrs() {
		cl := node(a)
		shards, err := cl.ClusterShards(context.Background()).Result()
		_ = cl.Close()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start > slot || slot > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					if n.Role == "master" {
						return fmt.Sprintf("%s:%d", n.IP, n.Port)
					}
				}
			}
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
	for _, a := range c.liveAddrs() {
		cl := node(a)
		role, err := cl.Do(context.Background(), "ROLE").Slice()
		_ = cl.Close()
		if err == nil && len(role) > 0 && role[0] == "master" && a != owner {
			return a
		}
	}
	c.tb.Fatal("hosttest: no other live primary")
	return ""
}

func slotOf(key string) int64 { return int64(crc16(hashTag(key)) % 16384) }

func (c *RedisCluster) liveAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range c.ports {
		n := c.nodes[p]
		select {
		case <-n.Done:
		default:
			out = append(out, fmt.Sprintf("127.0.0.1:%d", p))
		}
	}
	return out
}

// Kill sends SIGKILL to the node at addr and waits for it to exit.
func (c *RedisCluster) Kill(addr string) {
	c.tb.Helper()
	_, ps, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(ps)
	c.mu.Lock()
	n := c.nodes[p]
	c.mu.Unlock()
	if n == nil {
		c.tb.Fatalf("hosttest: no cluster node %s", addr)
	}
	_ = n.Cmd.Process.Signal(syscall.SIGKILL)
	<-n.Done
}

// Restart starts the node at addr again after Kill.
func (c *RedisCluster) Restart(addr string) {
	c.tb.Helper()
	_, ps, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(ps)
	c.start(p)
}

// WaitHealthy waits until every live node reports cluster_state:ok and
// agrees every slot is served, and every live replica is in sync with its
// primary.
func (c *RedisCluster) WaitHealthy(within time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := c.healthy()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("hosttest: redis cluster not healthy after %s: %s", within, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *RedisCluster) healthy() (bool, string) { return localcluster.Healthy(c.liveAddrs()) }

// hashTag is the part of key Redis Cluster hashes: the first {...} with
// something inside, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// crc16 is Redis Cluster's CRC16 (XMODEM).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
