package host

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/internal/adminapi"
	"github.com/usherhq/usher/host/internal/fleet"
	"github.com/usherhq/usher/host/internal/telemetry"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/host/workflow"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// The plugin fleet's reports, as the admin API, the console and the CLI
// read them (host/internal/fleet).
type (
	// PluginStatus describes one loaded plugin.
	PluginStatus = fleet.PluginStatus
	// ReloadResult is what a reload (or a rollback) did to one plugin.
	ReloadResult = fleet.ReloadResult
	// RollbackStatus is a plugin's last rollback.
	RollbackStatus = fleet.RollbackStatus
	// Refusal is a plugin that could not load when the host started.
	Refusal = fleet.Refusal
	// ReloadResponse is the admin API's answer to POST /plugins/reload
	// and /plugins/rollback.
	ReloadResponse = adminapi.ReloadResponse
	// PauseResponse is the admin API's answer to POST /kinds/pause and
	// /kinds/resume.
	PauseResponse = adminapi.PauseResponse
	// PhaseTotal is one batch phase's total time and count of batches.
	PhaseTotal = telemetry.PhaseTotal
)

// SwapHistory is how many swaps of each plugin PluginReport lists.
const SwapHistory = fleet.SwapHistory

// PluginRole is the Postgres login role plugin name's statements run as:
// see sandbox.PluginRole.
func PluginRole(name string) string { return sandbox.PluginRole(name) }

// LoadPlugin starts the plugin binary at path (no manifest, no checksum:
// the host keeps a copy of the bytes it read and restarts only that) and
// routes its kinds to it: see fleet.Fleet.LoadPlugin.
func (h *Host) LoadPlugin(ctx context.Context, path string) error {
	return h.fleet.LoadPlugin(ctx, path)
}

// LoadInProcess serves the plugin serve returns inside the host's own
// process (sdk/inprocess makes one of an *sdk.Plugin): the same handles,
// the plugin's own database role and pool, the same guards, but calls are
// method calls instead of gRPC between processes. It exists so that
// cmd/bench can measure what the plugin boundary costs; an in-process
// plugin is not isolated from the host, so never load untrusted code so.
func (h *Host) LoadInProcess(ctx context.Context, name string, serve func(usherv1.HostClient) usherv1.PluginServer) error {
	return h.fleet.LoadInProcess(ctx, name, serve)
}

// Kinds lists the kinds this host serves.
func (h *Host) Kinds() []string { return h.fleet.Kinds() }

// Paused reports whether this host holds kind paused now (its pause
// watcher's last read, at most PausePollInterval old): its deliveries
// wait in the stream.
func (h *Host) Paused(kind string) bool { return h.pauses.Paused(kind) }

// Cancelled reports whether this host holds job id cancelled on the
// stream now (its cancel watcher's last read: at once after the cancel's
// notification, at most PausePollInterval old without it): no delivery
// of it runs here.
func (h *Host) Cancelled(id string) bool { return h.cancels.Cancelled(id) }

// Plugins reports the loaded plugins.
func (h *Host) Plugins() []PluginStatus { return h.fleet.Plugins() }

// PluginReport is Plugins with each plugin's swap history read from the
// database: what the admin API's /plugins answers and the console shows.
func (h *Host) PluginReport(ctx context.Context) []PluginStatus { return h.fleet.PluginReport(ctx) }

// Refusals lists the plugins that could not load when the host started,
// with why, and have not loaded since. A refused plugin never stops the
// host: the others serve.
func (h *Host) Refusals() []Refusal { return h.fleet.Refusals() }

// Swap replaces the named plugin with the binary at path (no manifest, no
// checksum: a kept copy of the bytes read, as LoadPlugin) while jobs keep
// flowing; see pluginhost.Supervisor.Swap. The
// version it replaces stays restartable (Rollback), and the new one is on
// probation for Config.RollbackWindow: rolled back by itself if it fails.
func (h *Host) Swap(ctx context.Context, name, path string) (pluginhost.SwapResult, error) {
	return h.fleet.Swap(ctx, name, path)
}

// Reload re-reads PluginDir's manifests (only the one naming plugin name,
// when name is set) and applies what changed: see fleet.Fleet.Reload.
func (h *Host) Reload(ctx context.Context, name string) ([]ReloadResult, error) {
	return h.fleet.Reload(ctx, name)
}

// Rollback swaps plugin name back to the version its last swap replaced:
// see fleet.Fleet.Rollback.
func (h *Host) Rollback(ctx context.Context, name string) (ReloadResult, error) {
	return h.fleet.Rollback(ctx, name)
}

// Pool returns the host's Postgres pool.
func (h *Host) Pool() *pgxpool.Pool { return h.pool }

// Redis returns the host's Redis client.
func (h *Host) Redis() redis.UniversalClient { return h.rdb }

// AdminAddr is the address the admin API listens on while Run runs
// (useful with AdminAddr ":0"); empty before.
func (h *Host) AdminAddr() string {
	if h.admin == nil {
		return ""
	}
	return h.admin.Addr()
}

// EntryBytes reports what the stream consumer holds of its byte budget
// (Config.MaxEntryBytesHeld) now, and the most it has held; zeros before
// Run.
func (h *Host) EntryBytes() (held, peak int64) {
	return h.consumer.BytesHeld(), h.consumer.PeakBytesHeld()
}

// Verdicts is usher_jobs_total summed over kinds: how many of this host's
// job runs ended in each verdict (applied, absorbed, retry, permanent,
// abandoned, dead_letter). It reads the counters in memory, so a caller
// may poll it often (cmd/bench waits on it) without a query.
func (h *Host) Verdicts() map[string]int64 { return h.metrics.Verdicts() }

// BatchPhaseTotals is usher_job_batch_phase_seconds summed over plugin
// roles: for each phase (record, invoke, writes, commit) the time all
// committed batches spent in it, and their count.
func (h *Host) BatchPhaseTotals() map[string]PhaseTotal { return h.metrics.BatchPhaseTotals() }

// MigrateWorkflows moves the running workflows req selects to the plugin
// version now serving their type, each one only if that version accepts it
// (sdk.AcceptMigration); see workflow.Decider.Migrate.
func (h *Host) MigrateWorkflows(ctx context.Context, req workflow.MigrateRequest) (workflow.MigrateResult, error) {
	r, ok := h.fleet.Routes().Get(contract.WorkflowKind(req.Type))
	if !ok || r.Guard != usherv1.Guard_GUARD_WORKFLOW {
		return workflow.MigrateResult{Type: req.Type}, fmt.Errorf("host: no plugin here serves workflow type %q", req.Type)
	}
	return h.decider.Migrate(ctx, r.Plugin, r.Name, r.Plugin.Manifest().Version, req)
}

// PinnedVersions lists the plugin versions running beside the ones serving
// new work, to decide the workflows pinned to them, as "plugin@version".
func (h *Host) PinnedVersions() []string { return h.fleet.PinnedVersions() }
