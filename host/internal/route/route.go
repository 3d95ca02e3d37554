// Package route is the table that says where a kind's jobs go: the plugin
// fleet writes it (copy on write, under the fleet's own lock) and the job
// pipeline reads it with one atomic load and no lock. It holds no plugin
// logic of its own and never starts, stops or swaps anything.
package route

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/pluginhost"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Plugin is the running plugin a route calls: pluginhost.Supervisor.
type Plugin interface {
	guard.Invoker
	// Ready: running now (started and not crashed), so a call can go out.
	Ready() bool
	// Healthy: not marked unhealthy by a crash loop.
	Healthy() bool
	Manifest() pluginhost.Manifest
}

var _ Plugin = (*pluginhost.Supervisor)(nil)

// Counters are one plugin's live counts on this host, shared by its kinds'
// routes and kept across its swaps.
type Counters struct {
	// Parked counts the deliveries of the plugin's kinds left waiting in
	// the stream while it was unhealthy, restarting, or at its share of
	// stalled jobs, or its kind was paused or at its limit: a total since
	// the host started, which grows each time a waiting entry is read
	// again. ParkedNow counts the entries waiting now.
	Parked atomic.Int64
	// Stalled counts the plugin's jobs in flight for longer than the
	// host's StalledAfter; InFlight all its jobs running on this host.
	Stalled  atomic.Int64
	InFlight atomic.Int64

	// ParkedFor is how long an entry parked here, and not parked again,
	// still counts as parked now: a parked entry is read again within the
	// reclaim threshold, here or by another host's reclaimer, so one not
	// seen again for longer runs elsewhere. 0: for ever.
	ParkedFor time.Duration
	mu        sync.Mutex
	// parked is when each entry parked now (by its stream key and id) was
	// parked last; nParked its size, read without the lock; prune the
	// size at which Park next forgets the entries older than ParkedFor.
	parked  map[entryAt]time.Time
	nParked atomic.Int64
	prune   int
}

// entryAt names an entry: the stream key it was read from, and its id.
type entryAt struct{ stream, id string }

// Park counts a delivery of entry id of stream parked at now (Parked),
// and the entry as parked now until Unpark.
func (c *Counters) Park(stream, id string, now time.Time) {
	c.Parked.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parked == nil {
		c.parked = map[entryAt]time.Time{}
	}
	c.parked[entryAt{stream, id}] = now
	if len(c.parked) >= c.prune {
		c.forget(now)
		c.prune = max(64, 2*len(c.parked))
	}
	c.nParked.Store(int64(len(c.parked)))
}

// Unpark says entry id of stream is no longer waiting: it ran, or was
// settled, on this host. Cheap when nothing is parked: it runs for every
// job.
func (c *Counters) Unpark(stream, id string) {
	if c.nParked.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.parked, entryAt{stream, id})
	c.nParked.Store(int64(len(c.parked)))
}

// ParkedNow counts the entries of the plugin's kinds parked on this host
// as of now and not run or settled here since, forgetting those parked
// longer than ParkedFor ago.
func (c *Counters) ParkedNow(now time.Time) int64 {
	if c.nParked.Load() == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(now)
	c.nParked.Store(int64(len(c.parked)))
	return int64(len(c.parked))
}

// forget drops the entries parked longer than ParkedFor ago; c.mu held.
func (c *Counters) forget(now time.Time) {
	if c.ParkedFor <= 0 {
		return
	}
	for k, at := range c.parked {
		if now.Sub(at) > c.ParkedFor {
			delete(c.parked, k)
		}
	}
}

// Route is where one kind's jobs go.
type Route struct {
	// Name is the plugin's name.
	Name   string
	Plugin Plugin
	// DB is the plugin's own pool, logged in as its role.
	DB    guard.DB
	Guard usherv1.Guard
	// Counters are the plugin's (never nil in a Table).
	Counters *Counters
}

// Table maps kinds to routes. The zero value is an empty table.
type Table struct {
	p atomic.Pointer[map[string]Route]
}

// Get returns the route of kind: one atomic load.
func (t *Table) Get(kind string) (Route, bool) {
	m := t.p.Load()
	if m == nil {
		return Route{}, false
	}
	r, ok := (*m)[kind]
	return r, ok
}

// Kinds lists the kinds routed, sorted.
func (t *Table) Kinds() []string {
	m := t.p.Load()
	if m == nil {
		return []string{}
	}
	out := make([]string, 0, len(*m))
	for k := range *m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Update replaces the table by a copy that f changed. Writers serialise
// among themselves (the fleet holds its lock); readers never wait.
func (t *Table) Update(f func(map[string]Route)) {
	next := map[string]Route{}
	if m := t.p.Load(); m != nil {
		for k, r := range *m {
			next[k] = r
		}
	}
	f(next)
	t.p.Store(&next)
}
