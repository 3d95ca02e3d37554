package fleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/contract"
)

// A running workflow is decided by the plugin version that took its first
// decision (host/workflow). A swap routes new work to the new version; the
// versions that still have running workflows keep deciding them beside it,
// each as a supervisor of its own (a pinned version) under the plugin's
// role. Every version that serves a workflow type stores its binary in
// the workflow_binaries table when it loads or is swapped in, so that any
// host, after any restart, can start the version a workflow is pinned to
// from verified bytes. A pinned version with no running workflow left is
// stopped (retirePinned).

// ErrVersionStarting is Pinned's answer while the version is starting:
// the decision runs again shortly.
var ErrVersionStarting = errors.New("starting")

// pinRetry is how long a pinned version that failed to start is not tried
// again; pinCheck how often the pinned versions are checked for running
// workflows.
const (
	pinRetry = 5 * time.Second
	pinCheck = 5 * time.Second
)

type pinKey struct{ plugin, version string }

// pin is one pinned version: starting, running (sup) or failed (err,
// until failedAt+pinRetry).
type pin struct {
	sup      *pluginhost.Supervisor
	pcfg     pluginhost.Config
	starting bool
	err      error
	failedAt time.Time
}

// servesWorkflows reports whether m declares a workflow type.
func servesWorkflows(m pluginhost.Manifest) bool {
	for _, k := range m.Kinds {
		if _, ok := contract.WorkflowType(k.Kind); ok {
			return true
		}
	}
	return false
}

// storeBinary keeps the binary of m's version, started from kept, in
// workflow_binaries when m serves a workflow type; a version stored
// already is marked newest. A failure is logged: the version serves, but
// a workflow pinned to it cannot be decided after it is swapped out of a
// host that no longer runs it.
func (f *Fleet) storeBinary(ctx context.Context, m pluginhost.Manifest, kept pluginhost.Config) {
	if !servesWorkflows(m) || kept.InProcess != nil || len(kept.SHA256) == 0 {
		return
	}
	sum := hex.EncodeToString(kept.SHA256)
	err := func() error {
		tag, err := f.cfg.Pool.Exec(ctx, `UPDATE workflow_binaries SET stored_at = now()
			WHERE plugin = $1 AND version = $2 AND sha256 = $3`, m.Name, m.Version, sum)
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		b, err := os.ReadFile(kept.Path)
		if err != nil {
			return err
		}
		if got := sha256.Sum256(b); !bytes.Equal(got[:], kept.SHA256) {
			return fmt.Errorf("the kept copy %s is not the binary verified (SHA-256 %x)", kept.Path, got)
		}
		_, err = f.cfg.Pool.Exec(ctx, `INSERT INTO workflow_binaries (plugin, version, sha256, bytes) VALUES ($1, $2, $3, $4)
			ON CONFLICT (plugin, version) DO UPDATE SET sha256 = EXCLUDED.sha256, bytes = EXCLUDED.bytes, stored_at = now()`,
			m.Name, m.Version, sum, b)
		return err
	}()
	if err != nil {
		f.log.Error("could not store the binary of a plugin version that serves workflows: its running workflows cannot be decided once it is swapped out",
			"plugin", m.Name, "version", m.Version, "err", err)
	}
}

// Pinned is the plugin version that must decide a workflow pinned to it
// when the route serves another: a version running beside it, or, the
// first time, ErrVersionStarting while a fleet task starts it from its
// stored binary. A version that cannot start is its error for pinRetry.
func (f *Fleet) Pinned(plugin, version string) (guard.Invoker, error) {
	k := pinKey{plugin, version}
	f.pinMu.Lock()
	defer f.pinMu.Unlock()
	p := f.pins[k]
	switch {
	case p != nil && p.sup != nil:
		return p.sup, nil
	case p != nil && p.starting:
		return nil, fmt.Errorf("plugin %s version %s: %w", plugin, version, ErrVersionStarting)
	case p != nil && time.Since(p.failedAt) < pinRetry:
		return nil, p.err
	}
	// Started under mu, as autoRollback's: Run clears runCtx under mu
	// before it waits for the tasks, so none starts after that wait.
	f.mu.RLock()
	defer f.mu.RUnlock()
	ctx := f.runCtx
	if ctx == nil || ctx.Err() != nil {
		return nil, fmt.Errorf("plugin %s version %s is not running and the host is stopping", plugin, version)
	}
	if f.pins == nil {
		f.pins = map[pinKey]*pin{}
	}
	f.pins[k] = &pin{starting: true}
	f.tasks.Go(func() { f.startPinned(context.WithoutCancel(ctx), k) })
	return nil, fmt.Errorf("plugin %s version %s: %w", plugin, version, ErrVersionStarting)
}

// startPinned starts version k from its stored binary, verified against
// its sum, and records how it went.
func (f *Fleet) startPinned(ctx context.Context, k pinKey) {
	sup, pcfg, err := f.openPinned(ctx, k)
	f.pinMu.Lock()
	defer f.pinMu.Unlock()
	p := f.pins[k]
	if err != nil {
		err = fmt.Errorf("plugin %s version %s, to which running workflows are pinned, cannot start: %w", k.plugin, k.version, err)
		f.log.Error("pinned plugin version did not start", "plugin", k.plugin, "version", k.version, "err", err)
		p.starting, p.err, p.failedAt = false, err, time.Now()
		return
	}
	f.mu.Lock()
	if f.supCtx == nil {
		f.mu.Unlock()
		sup.Stop()
		f.kept.release(pcfg.Path)
		delete(f.pins, k)
		return
	}
	f.supervise(sup)
	f.mu.Unlock()
	p.starting, p.sup, p.pcfg, p.err = false, sup, pcfg, nil
	f.log.Info("pinned plugin version started beside the one serving new work: it decides the workflows pinned to it",
		"plugin", k.plugin, "version", k.version, "pid", sup.Pid())
}

func (f *Fleet) openPinned(ctx context.Context, k pinKey) (*pluginhost.Supervisor, pluginhost.Config, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var sum string
	var bin []byte
	err := f.cfg.Pool.QueryRow(ctx, `SELECT sha256, bytes FROM workflow_binaries WHERE plugin = $1 AND version = $2`,
		k.plugin, k.version).Scan(&sum, &bin)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, pluginhost.Config{}, errors.New("its binary is not stored (workflow_binaries): move its workflows with `host workflows migrate`")
	}
	if err != nil {
		return nil, pluginhost.Config{}, err
	}
	want, err := hex.DecodeString(sum)
	if err != nil {
		return nil, pluginhost.Config{}, fmt.Errorf("stored checksum %q: %w", sum, err)
	}
	dir, err := os.MkdirTemp("", "usher-pinned-*")
	if err != nil {
		return nil, pluginhost.Config{}, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, k.plugin)
	if err := os.WriteFile(src, bin, 0o500); err != nil {
		return nil, pluginhost.Config{}, err
	}
	pcfg := f.pluginConfig(src)
	pcfg.SHA256, pcfg.Name, pcfg.Version = want, k.plugin, k.version
	kept, err := f.kept.keep(pcfg) // verified against the stored sum
	if err != nil {
		return nil, pluginhost.Config{}, err
	}
	sup, err := pluginhost.NewSupervisor(ctx, pluginhost.SupervisorConfig{
		Plugin: kept, CrashLoop: f.cfg.CrashLoop, CrashWindow: f.cfg.CrashWindow, UnhealthyRetry: f.cfg.UnhealthyRetry,
		DrainTimeout: f.cfg.DrainTimeout,
		OnRestart: func(m pluginhost.Manifest, pid int) {
			f.cfg.Metrics.Restarts.WithLabelValues(m.Name).Inc()
		},
	})
	if err != nil {
		f.kept.release(kept.Path)
		return nil, pluginhost.Config{}, err
	}
	if m := sup.Manifest(); m.Name != k.plugin || m.Version != k.version || !servesWorkflows(m) {
		sup.Stop()
		f.kept.release(kept.Path)
		return nil, pluginhost.Config{}, fmt.Errorf("the stored binary reports plugin %s version %s", m.Name, m.Version)
	}
	return sup, kept, nil
}

// retirePinned stops, every pinCheck, the pinned versions no running
// workflow is pinned to any more, until ctx is done.
func (f *Fleet) retirePinned(ctx context.Context) error {
	t := time.NewTicker(pinCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		f.pinMu.Lock()
		var keys []pinKey
		for k, p := range f.pins {
			if p.sup != nil || !p.starting {
				keys = append(keys, k)
			}
		}
		f.pinMu.Unlock()
		for _, k := range keys {
			var running bool
			if err := f.cfg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workflows
				WHERE state = 'running' AND plugin = $1 AND plugin_version = $2)`, k.plugin, k.version).Scan(&running); err != nil {
				if ctx.Err() == nil {
					f.log.Warn("could not count the workflows pinned to a plugin version", "plugin", k.plugin, "version", k.version, "err", err)
				}
				continue
			}
			if !running {
				f.dropPinned(k, "no running workflow is pinned to it")
			}
		}
	}
}

// dropPinned stops pinned version k, if it runs, and forgets it.
func (f *Fleet) dropPinned(k pinKey, why string) {
	f.pinMu.Lock()
	p := f.pins[k]
	if p == nil || p.starting {
		f.pinMu.Unlock()
		return
	}
	delete(f.pins, k)
	f.pinMu.Unlock()
	if p.sup != nil {
		p.sup.Stop()
		f.kept.release(p.pcfg.Path)
		f.log.Info("pinned plugin version stopped", "plugin", k.plugin, "version", k.version, "why", why)
	}
}

// stopPinned stops every pinned version (Close).
func (f *Fleet) stopPinned() {
	f.pinMu.Lock()
	pins := f.pins
	f.pins = nil
	f.pinMu.Unlock()
	for _, p := range pins {
		if p.sup != nil {
			p.sup.Stop()
		}
	}
}

// PinnedVersions lists the pinned versions running beside the ones
// serving new work, as "plugin@version".
func (f *Fleet) PinnedVersions() []string {
	f.pinMu.Lock()
	defer f.pinMu.Unlock()
	var out []string
	for k, p := range f.pins {
		if p.sup != nil {
			out = append(out, k.plugin+"@"+k.version)
		}
	}
	slices.Sort(out)
	return out
}
