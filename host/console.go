package host

import (
	"context"
	"fmt"
	"net/http"

	"github.com/usherhq/usher/host/console"
)

// serveConsole mounts the web console on the admin mux and adds its
// sampler to loops. It reads what the admin API and the CLI read: the
// runtime's pool and stream, Plugins, Reload and the host's metrics.
func (h *Host) serveConsole(mux *http.ServeMux, loops map[string]func(context.Context) error) error {
	c, err := console.New(console.Config{
		Pool: h.pool, Redis: h.rdb, Stream: h.cfg.Stream, Group: h.cfg.Group,
		Token: h.adminToken, Metrics: h.metrics.reg, SampleInterval: h.cfg.ConsoleSampleInterval,
		Plugins: h.consolePlugins, Reload: h.consoleReload, Logger: h.log,
	})
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	mux.Handle(console.Prefix, c.Handler())
	loops["console"] = c.Run
	return nil
}

func (h *Host) consolePlugins() []console.Plugin {
	var out []console.Plugin
	for _, p := range h.Plugins() {
		cp := console.Plugin{Name: p.Name, Version: p.Version, Manifest: p.Manifest, SHA256: p.SHA256, Pid: p.Pid,
			Healthy: p.Healthy, Restarts: p.Restarts, Parked: p.Parked, Kinds: p.Kinds, Previous: p.Previous,
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
