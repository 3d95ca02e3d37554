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
	"sync"
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
// port) free too, both below the kernel's ephemeral range
// (ip_local_port_range), where no outgoing connection takes them while a
// killed node is down: a node restarted on a port (Restart) whose bus port
// an outgoing connection had meanwhile been given could not bind it.
func Ports(n int) ([]int, error) {
	lo, hi := portRange()
	var ports []int
	held := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := lo + rand.IntN(hi-lo)
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

// portRange is where Ports picks a node's port: [lo, hi), with the bus
// ports (10000 above) outside the kernel's ephemeral range: below it, or,
// when it starts too low for that, above it.
func portRange() (lo, hi int) {
	first, last := 32768, 60999 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			a, errA := strconv.Atoi(f[0])
			z, errZ := strconv.Atoi(f[1])
			if errA == nil && errZ == nil {
				first, last = a, z
			}
		}
	}
	const width = 8000 // ample for 6 nodes, with others' clusters beside
	if hi := first - 10000; hi >= 10000+2000 {
		return max(hi-width, 10000), hi
	}
	if lo, top := last+1, 65535-10000; top-lo >= 2000 {
		return lo, min(lo+width, top)
	}
	return 20000, 40000 // no room outside it: a restart may find its port taken
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
	// Its own process group: a Ctrl-C at the terminal reaches only the
	// program that started it, which stops the nodes in its own order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
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
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			if len(log) > 2000 {
				log = log[len(log)-2000:]
			}
			return nil, fmt.Errorf("localcluster: redis-server on %d did not answer: %w; its log ends:\n%s", port, err, log)
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

// Cluster is a running cluster of Nodes nodes. Its methods are safe for
// concurrent use.
type Cluster struct {
	dir   string
	mu    sync.Mutex
	ports []int
	nodes map[int]*Node // by port
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
	c := &Cluster{dir: dir, ports: ports, nodes: map[int]*Node{}}
	for _, p := range ports {
		n, err := StartNode(dir, p)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes[p] = n
	}
	if err := Create(ports); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Addrs are the nodes' addresses, host:port, running or not.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.ports))
	for i, p := range c.ports {
		out[i] = addr(p)
	}
	return out
}

func addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

// LiveAddrs are the addresses of the nodes whose process runs.
func (c *Cluster) LiveAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range c.ports {
		select {
		case <-c.nodes[p].Done:
		default:
			out = append(out, addr(p))
		}
	}
	return out
}

// URL is the redis-cluster:// URL of every node.
func (c *Cluster) URL() string { return "redis-cluster://" + strings.Join(c.Addrs(), ",") }

// Dir is the directory of node addr's files (its redis.log among them).
func (c *Cluster) Dir(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return filepath.Join(c.dir, port)
}

// Node is the running process of the node at addr (nil when there is no
// such node).
func (c *Cluster) Node(addr string) *Node {
	_, ps, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(ps)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[p]
}

// Kill sends SIGKILL to the node at addr and waits for it to exit.
func (c *Cluster) Kill(addr string) error {
	n := c.Node(addr)
	if n == nil {
		return fmt.Errorf("localcluster: no node %s", addr)
	}
	_ = n.Cmd.Process.Signal(syscall.SIGKILL)
	<-n.Done
	return nil
}

// Restart starts the node at addr again after Kill, on its port and with
// its files: it rejoins with its nodes.conf, as a replica when it was
// failed over meanwhile.
func (c *Cluster) Restart(addr string) error {
	old := c.Node(addr)
	if old == nil {
		return fmt.Errorf("localcluster: no node %s", addr)
	}
	select {
	case <-old.Done:
	default:
		return fmt.Errorf("localcluster: node %s is still running", addr)
	}
	n, err := StartNode(c.dir, old.Port)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.nodes[old.Port] = n
	c.mu.Unlock()
	return nil
}

// Healthy is Healthy of the live nodes.
func (c *Cluster) Healthy() (bool, string) { return Healthy(c.LiveAddrs()) }

// WaitHealthy waits until Healthy, at most within.
func (c *Cluster) WaitHealthy(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ok, why := c.Healthy()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localcluster: not healthy after %s: %s", within, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitReplica waits until the node at addr is a replica in sync with its
// primary (a primary restarted after its failover turns into one once the
// others tell it its slots moved) and the cluster is Healthy, at most
// within. Healthy alone can pass before: the restarted node first comes
// back as the primary its nodes.conf says it was.
func (c *Cluster) WaitReplica(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		cl := client(addr)
		repl, err := cl.Info(context.Background(), "replication").Result()
		_ = cl.Close()
		why := fmt.Sprintf("%s: %v", addr, err)
		if err == nil {
			why = addr + " is not a replica in sync with its primary"
			if strings.Contains(repl, "role:slave") && strings.Contains(repl, "master_link_status:up") {
				var ok bool
				if ok, why = c.Healthy(); ok {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localcluster: after %s: %s", within, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PrimaryFor is the address of the primary serving key's slot, as every
// live node sees it: an error when one cannot say or two disagree (a
// failover under way).
func (c *Cluster) PrimaryFor(ctx context.Context, key string) (string, error) {
	live := c.LiveAddrs()
	if len(live) == 0 {
		return "", errors.New("localcluster: no live node")
	}
	var primary string
	for _, a := range live {
		cl := client(a)
		p, err := primaryFor(ctx, cl, key)
		_ = cl.Close()
		switch {
		case err != nil:
			return "", fmt.Errorf("%s: %w", a, err)
		case primary != "" && p != primary:
			return "", fmt.Errorf("localcluster: %s says %s serves %q, another node %s", a, p, key, primary)
		}
		primary = p
	}
	return primary, nil
}

// PrimarySeenBy is the address of the primary serving key's slot as the
// node at addr alone sees it: during a failover another node may still
// disagree (PrimaryFor says so).
func PrimarySeenBy(ctx context.Context, addr, key string) (string, error) {
	cl := client(addr)
	defer cl.Close()
	return primaryFor(ctx, cl, key)
}

// primaryFor asks one node who serves key's slot (CLUSTER KEYSLOT, CLUSTER
// SHARDS).
func primaryFor(ctx context.Context, cl *redis.Client, key string) (string, error) {
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", err
	}
	shards, err := cl.ClusterShards(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start > slot || slot > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role == "master" {
					return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)), nil
				}
			}
		}
	}
	return "", fmt.Errorf("localcluster: slot %d of %q is not served", slot, key)
}

// Stop kills every node and waits for it to exit.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		_ = n.Cmd.Process.Kill()
		<-n.Done
	}
}
