package host

import (
	"context"
	"fmt"
	"net/http"

	"github.com/usherhq/usher/host/console"
)

// serveConsole mounts the web console on the admin mux. It reads what
// the admin API and the CLI read: the runtime's pool and stream, the job
// history, PluginReport and Reload.
func (h *Host) serveConsole(mux *http.ServeMux) error {
	c, err := console.New(console.Config{
		Pool: h.pool, Redis: h.rdb, Stream: h.cfg.Stream, Group: h.cfg.Group,
		Token: h.adminToken, ChartWindow: h.cfg.ConsoleChartWindow, ChartBucket: h.cfg.ConsoleChartBucket,
		Plugins: h.consolePlugins, Reload: h.consoleReload, Logger: h.log,
	})
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	mux.Handle(console.Prefix, c.Handler())
	return nil
}

func (h *Host) consolePlugins(ctx context.Context) []console.Plugin {
	var out []console.Plugin
	for _, p := range h.PluginReport(ctx) {
		cp := console.Plugin{Name: p.Name, Version: p.Version, Manifest: p.Manifest, SHA256: p.SHA256, Pid: p.Pid,
			Healthy: p.Healthy, Restarts: p.Restarts, Parked: p.Parked, InFlight: p.InFlight, Kinds: p.Kinds, Swaps: p.Swaps, Previous: p.Previous,
			ProbationUntil: p.ProbationUntil, Refused: p.Refused, RefusedReason: p.RefusedReason}
		if r := p.LastRollback; r != nil {
			cp.LastRollback = fmt.Sprintf("%s → %s at %s (%s: %s)", r.From, r.To, r.At.UTC().Format("2006-01-02 15:04:05Z"), r.Cause, r.Reason)
		}
		out = append(out, cp)
	}
	return out
}

func (h *Host) consoleReload(ctx context.Context, name string) ([]console.ReloadResult, error) {
	res, err := h.Reload(ctx, name)
	out := make([]console.ReloadResult, 0, len(res))
	for _, r := range res {
		out = append(out, console.ReloadResult{Plugin: r.Plugin, Action: r.Action, From: r.From, To: r.To, Error: r.Error})
	}
	return out, err
}
