// Package localcluster runs a Redis Cluster on loopback from the machine's
// redis-server (Debian's redis-server package): 3 primaries with a replica
// each, on free ports, each node in a directory of its own. The tests
// (host/hosttest.StartRedisCluster) and the bench's scale rows use it.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeTimeout is the cluster-node-timeout the nodes run with: a primary
// unreachable this long is failed over to its replica.
const NodeTimeout = 2 * time.Second

// Nodes is how many nodes a cluster has: 3 primaries, 3 replicas.
const Nodes = 6

// Node is one running redis-server.
type Node struct {
	Port int
	Cmd  *exec.Cmd
	// Done is closed when the process has exited.
	Done chan struct{}
}

// Ports finds n ports p free on loopback with p+10000 (the cluster bus
// port) free too.
func Ports(n int) ([]int, error) {
	var ports []int
	held := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 20000 + rand.IntN(20000)
		if held[p] || held[p+10000] {
			continue
		}
		a, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+10000))
		_ = a.Close()
		if err != nil {
			continue
		}
		_ = b.Close()
		held[p], held[p+10000] = true, true
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, errors.New("localcluster: no free ports for a Redis Cluster")
	}
	return ports, nil
}

// StartNode runs a cluster node on port with its files in dir/<port>
// (again, after a kill: it rejoins with its nodes.conf, as a replica if it
// was failed over meanwhile), and waits until it answers PING. The node
// dies with this process (Pdeathsig).
func StartNode(dir string, port int) (*Node, error) {
	dir = filepath.Join(dir, strconv.Itoa(port))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(NodeTimeout.Milliseconds(), 10),
		"--dir", dir, "--save", "", "--repl-diskless-sync-delay", "0", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: redis-server on %d: %w", port, err)
	}
	n := &Node{Port: port, Cmd: cmd, Done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(n.Done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cl := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
		err := cl.Ping(context.Background()).Err()
		_ = cl.Close()
		if err == nil {
			return n, nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-n.Done
			return nil, fmt.Errorf("localcluster: redis-server on %d did not answer: %w", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Create joins the nodes on ports into a cluster, one replica per primary
// (`redis-cli --cluster create ... --cluster-replicas 1`).
func Create(ports []int) error {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return fmt.Errorf("localcluster: redis-cli not found (Debian's redis-server package has it): %w", err)
	}
	args := []string{"--cluster", "create"}
	for _, p := range ports {
		args = append(args, fmt.Sprintf("127.0.0.1:%d", p))
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("localcluster: redis-cli --cluster create: %w\n%s", err, out)
	}
	return nil
}

// Healthy reports whether every node of addrs says the cluster is ok with
// every slot served, and every replica is in sync with its primary (a
// replica that has not finished its first sync cannot be promoted); when
// not, it says why.
func Healthy(addrs []string) (bool, string) {
	for _, a := range addrs {
		cl := client(a)
		info, err := cl.ClusterInfo(context.Background()).Result()
		_ = cl.Close()
		if err != nil {
			return false, fmt.Sprintf("%s: %v", a, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return false, fmt.Sprintf("%s: %s", a, strings.ReplaceAll(info, "\r\n", " "))
		}
		cl = client(a)
		repl, err := cl.Info(context.Background(), "replication").Result()
		_ = cl.Close()
		if err != nil {
			return false, fmt.Sprintf("%s: %v", a, err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return false, fmt.Sprintf("%s: replica not in sync with its primary", a)
		}
	}
	return true, ""
}

// client is a client of the node at addr alone.
func client(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
}

// Cluster is a running cluster of Nodes nodes.
type Cluster struct {
	nodes []*Node
}

// Start runs a cluster with its files under dir and waits until it is
// healthy (within 30 s).
func Start(dir string) (*Cluster, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("localcluster: redis-server not found (Debian's redis-server package has it): %w", err)
	}
	ports, err := Ports(Nodes)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for _, p := range ports {
		n, err := StartNode(dir, p)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if err := Create(ports); err != nil {
		c.Stop()
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := Healthy(c.Addrs())
		if ok {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("localcluster: not healthy after 30s: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addrs are the nodes' addresses, host:port.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	return out
}

// URL is the redis-cluster:// URL of every node.
func (c *Cluster) URL() string { return "redis-cluster://" + strings.Join(c.Addrs(), ",") }

// Stop kills every node and waits for it to exit.
func (c *Cluster) Stop() {
	for _, n := range c.nodes {
		_ = n.Cmd.Process.Kill()
		<-n.Done
	}
}
