package host_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/procstat"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/inprocess"
)

// BenchmarkCountersEndToEnd measures jobs per second through a real host:
// b.N update_sales_counter jobs committed to the outbox, then relayed,
// consumed, run through guard 4 in the counters plugin process, committed
// and acked. Run with -benchtime Nx.
func BenchmarkCountersEndToEnd(b *testing.B) {
	pool, url := hosttest.DB(b)
	rdb, stream := hosttest.Redis(b)
	ctx := context.Background()
	var ev int64
	if err := pool.QueryRow(ctx, `INSERT INTO events (name) VALUES ('bench') RETURNING id`).Scan(&ev); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		WITH o AS (INSERT INTO orders (public_id, event_id, buyer, email, seats)
		           SELECT 'B-' || n, $1, 'b', 'b@example.com', 1 FROM generate_series(1, $2::int) n RETURNING id)
		INSERT INTO outbox (kind, payload) SELECT 'update_sales_counter', jsonb_build_object('order_id', id) FROM o`, ev, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	h := hosttest.Start(b, hostConfig(url, rdb, stream, hosttest.Build(b, "./plugins/counters")))
	hosttest.Eventually(b, 10*time.Minute, "every job applied", func() bool {
		return hosttest.Count(b, pool, `SELECT count(*) FROM processed_jobs`) == int64(b.N)
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	_ = h.Stop()
}

// BenchmarkCountersThroughput is the workload through a warmed
// host: b.N update_sales_counter jobs over 100 events, committed to the
// outbox in one transaction after the host and its plugin are up and have
// run 200 jobs, timed until every job is applied and acked. ns/op is per
// job. Run with -benchtime 5000x and -cpuprofile to see the host's share.
// plugin runs the counters plugin as its own process; in-process serves
// the same handler inside the host (Host.LoadInProcess), so the two give
// the plugin boundary's cost.
func BenchmarkCountersThroughput(b *testing.B) {
	b.Run("plugin", func(b *testing.B) { benchCounters(b, false) })
	b.Run("in-process", func(b *testing.B) { benchCounters(b, true) })
}

func benchCounters(b *testing.B, inProcess bool) {
	pool, url := hosttest.DB(b)
	rdb, stream := hosttest.Redis(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO events (name) SELECT 'bench ' || n FROM generate_series(1, 100) n`); err != nil {
		b.Fatal(err)
	}
	enqueue := func(n int) {
		if _, err := pool.Exec(ctx, `
			WITH o AS (INSERT INTO orders (public_id, event_id, buyer, email, seats)
			           SELECT 'B-' || gen_random_uuid(), (SELECT min(id) FROM events) + n % 100, 'b', 'b@example.com', 1 + n % 6
			           FROM generate_series(1, $1::int) n RETURNING id)
			INSERT INTO outbox (kind, payload) SELECT 'update_sales_counter', jsonb_build_object('order_id', id) FROM o`, n); err != nil {
			b.Fatal(err)
		}
	}
	cfg := hostConfig(url, rdb, stream, hosttest.Build(b, "./plugins/counters"))
	cfg.AdminAddr = "127.0.0.1:0"
	if inProcess {
		cfg.Plugins = nil
	}
	h := hosttest.Start(b, cfg)
	if inProcess {
		p := sdk.New("counters", "in-process")
		sdk.HandleRecordJobID(p, counter.Handler{Version: "in-process"})
		if err := h.LoadInProcess(ctx, "counters", inprocess.Server(p)); err != nil {
			b.Fatal(err)
		}
	}
	enqueue(200)
	done := func(n int64) func() bool {
		return func() bool {
			return hosttest.Count(b, pool, `SELECT count(*) FROM processed_jobs`) == n && hosttest.Pending(b, rdb, stream, "usher") == 0
		}
	}
	hosttest.Eventually(b, time.Minute, "the warm-up jobs", done(200))
	pid := h.Plugins()[0].Pid
	batches0, batched0 := batchStats(b, h)
	b.ResetTimer()
	start, hostCPU, pluginCPU := time.Now(), procstat.SelfCPU(), cpuOf(b, pid)
	if inProcess {
		pluginCPU = 0 // counted in the host's
	}
	enqueue(b.N)
	hosttest.Eventually(b, 10*time.Minute, "every job applied", done(int64(200+b.N)))
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	// CPU per job is steadier than jobs/s on a shared machine.
	b.ReportMetric(float64((procstat.SelfCPU()-hostCPU).Microseconds())/float64(b.N), "host-cpu-µs/job")
	if !inProcess {
		b.ReportMetric(float64((cpuOf(b, pid)-pluginCPU).Microseconds())/float64(b.N), "plugin-cpu-µs/job")
	}
	// How well the jobs batch explains most of the rest.
	batches, batched := batchStats(b, h)
	if batches > batches0 {
		b.ReportMetric((batched-batched0)/(batches-batches0), "jobs/batch")
	}
	b.ReportMetric(100*(batched-batched0)/float64(b.N), "batched-%")
	_ = h.Stop()
}

func cpuOf(tb testing.TB, pid int) time.Duration {
	d, err := procstat.CPU(pid)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// batchStats reads how many batches of two jobs or more committed, and
// how many jobs they held, from the host's metrics.
func batchStats(tb testing.TB, h *hosttest.Running) (batches, jobs float64) {
	m := metricsText(tb, h)
	for name, v := range map[string]*float64{"count": &batches, "sum": &jobs} {
		re := regexp.MustCompile(`usher_job_batch_size_` + name + `\{result="committed",role="[^"]*"\} (\S+)`)
		for _, mm := range re.FindAllStringSubmatch(m, -1) {
			f, _ := strconv.ParseFloat(mm[1], 64)
			*v += f
		}
	}
	return batches, jobs
}
