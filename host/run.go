package host

import (
	"context"

	"github.com/usherhq/usher/host/internal/lifecycle"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/recurring"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/host/workflow"
)

// Run serves until ctx is done, then stops reading, gives in-flight jobs a
// grace period (those that do not finish stay unacked and are reclaimed),
// stops the plugins and returns. The services start in phases: the plugin
// fleet, the background loops (relay and reconciler, scheduler and workflow timers, retention), the stream (consumer, reclaimer, redispatcher), the admin
// API; they stop in reverse, so the plugins stop only once no job is in
// flight. A service that fails stops the others, and Run returns its
// error, naming it, once every goroutine has ended.
func (h *Host) Run(ctx context.Context) error {
	phases, err := h.phases()
	if err != nil {
		return err
	}
	err = lifecycle.NewGroup(phases...).Run(ctx)
	h.log.Info("host stopped", "consumer", h.cfg.Consumer)
	return err
}

// phases builds Run's services.
func (h *Host) phases() ([]lifecycle.Phase, error) {
	cfg := h.cfg
	rec, err := stream.NewReclaimer(stream.ReclaimerConfig{
		Redis: h.rdb, Streams: h.keys, Group: cfg.Group, Consumer: cfg.Consumer,
		MinIdle: cfg.ReclaimIdle, Interval: cfg.ReclaimInterval, Take: h.consumer.Take,
		OnReclaimed: func(n int) { h.metrics.Reclaimed.Add(float64(n)) }, Logger: h.log,
	})
	if err != nil {
		return nil, err
	}
	streamServices := []lifecycle.Service{
		lifecycle.Func("consumer", h.consumer.Run), lifecycle.Func("reclaim", rec.Run),
		lifecycle.Func("redispatch", h.redispatcher.Run),
	}
	if cfg.HostLeaseTTL > 0 {
		lease, err := stream.NewLease(stream.LeaseConfig{
			Redis: h.rdb, Streams: h.keys, Group: cfg.Group, Consumer: cfg.Consumer, TTL: cfg.HostLeaseTTL,
			Take: h.consumer.Take, OnClaimed: func(n int) { h.metrics.Reclaimed.Add(float64(n)) }, Logger: h.log,
		})
		if err != nil {
			return nil, err
		}
		streamServices = append(streamServices, lifecycle.Func("host lease", lease.Run))
	}
	var background []lifecycle.Service
	if !cfg.DisableRelay {
		relay, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: h.pool, Redis: h.rdb, Stream: cfg.Stream, Shards: cfg.StreamShards, Key: h.key, PollInterval: cfg.RelayPollInterval, Replicas: cfg.RelayReplicas,
			AfterPublish: cfg.RelayAfterPublish, Logger: h.log,
			OnPublished: func(n int) { h.metrics.Published.Add(float64(n)) },
			// What this host published is read now, not at the next poll.
			OnAdded: h.consumer.Wake,
		})
		if err != nil {
			return nil, err
		}
		republish, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: h.pool, Redis: h.rdb, Streams: h.keys, Group: cfg.Group,
			Grace: cfg.reconcileGrace(), StaleAfter: cfg.ReconcileAfter, Interval: cfg.ReconcileInterval, Logger: h.log})
		if err != nil {
			return nil, err
		}
		background = append(background, lifecycle.Func("relay", relay.Run), lifecycle.Func("reconciler", republish.Run))
	}
	if !cfg.DisableScheduler {
		sched, err := schedule.New(schedule.Config{Pool: h.pool, Logger: h.log})
		if err != nil {
			return nil, err
		}
		timers, err := workflow.NewTimers(workflow.TimersConfig{Pool: h.pool, Logger: h.log})
		if err != nil {
			return nil, err
		}
		ticker, err := recurring.NewTicker(recurring.TickerConfig{Pool: h.pool, Logger: h.log})
		if err != nil {
			return nil, err
		}
		background = append(background, lifecycle.Func("scheduler", sched.Run), lifecycle.Func("workflow timers", timers.Run),
			lifecycle.Func("schedules", ticker.Run))
	}
	ret, err := h.retainer()
	if err != nil {
		return nil, err
	}
	// Started once the paused kinds, the kinds' limits and the cancels of
	// jobs on the stream are read: the stream phase after them runs no
	// entry of a paused kind or of a job cancelled before this host
	// started, and holds every limit.
	background = append(background, lifecycle.Func("retention", ret.Run), lifecycle.FuncReady("pauses", h.pauses.Run),
		lifecycle.FuncReady("limits", h.limits.Run), lifecycle.FuncReady("cancels", h.cancels.Run))
	phases := []lifecycle.Phase{
		{Name: "plugins", Services: []lifecycle.Service{lifecycle.Func("fleet", h.fleet.Run)}},
		{Name: "background", Services: background},
		{Name: "stream", Services: streamServices},
	}
	if h.admin != nil {
		phases = append(phases, lifecycle.Phase{Name: "admin", Services: []lifecycle.Service{lifecycle.FuncReady("admin", h.admin.Run)}})
	}
	return phases, nil
}
