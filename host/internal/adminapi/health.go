package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// HealthTimeout bounds each dependency's probe of one /healthz: a host
// whose Postgres or Redis does not answer this fast is reported unhealthy.
const HealthTimeout = 2 * time.Second

// serveHealth is GET /healthz: 200 "ok" when Postgres answers a ping and
// the Redis node serving the stream's slot answers a command on the
// stream's key (what reading, acking and publishing need); else 503 with
// one "unhealthy: <dependency>: <error>" line per dependency that failed.
// Both are probed on every request, at once, each within HealthTimeout.
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), HealthTimeout)
	defer cancel()
	var mu sync.Mutex
	var problems []string
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, fmt.Sprintf("unhealthy: %s: %v", what, err))
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := s.cfg.Pool.Ping(ctx); err != nil {
			fail("postgres", err)
		}
	}()
	go func() {
		defer wg.Done()
		// EXISTS on each shard's key goes to the primary serving its
		// slot (on a cluster, PING would go to any node).
		shards := s.cfg.Shards
		if len(shards) == 0 {
			shards = []string{s.cfg.Stream}
		}
		cmds, _ := s.cfg.Redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, k := range shards {
				pipe.Exists(ctx, k)
			}
			return nil
		})
		for i, c := range cmds {
			if err := c.Err(); err != nil {
				fail("redis", fmt.Errorf("stream shard %s: %w", shards[i], err))
			}
		}
	}()
	wg.Wait()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(problems) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(strings.Join(problems, "\n") + "\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}
