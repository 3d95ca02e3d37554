package pluginhost

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fsnotify/fsnotify"
)

// WatchConfig configures a Watcher.
type WatchConfig struct {
	// Dir is the plugin directory. Required.
	Dir string
	// OnChange is called, never concurrently, when the directory's content
	// changed (a file added, removed, rewritten or renamed). Required.
	OnChange func(ctx context.Context)
	// PollInterval is how often the directory is compared with what was
	// last seen, besides fsnotify's events: the fallback when fsnotify is
	// unavailable or misses an event. Default 2s.
	PollInterval time.Duration
	// Debounce is how long the directory must stay quiet after an event
	// before OnChange runs, so a binary and its manifest written one after
	// the other make one change. Default 300ms.
	Debounce time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *WatchConfig) setDefaults() error {
	if c.Dir == "" || c.OnChange == nil {
		return errors.New("pluginhost: watcher needs Dir and OnChange")
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 2 * time.Second
	}
	if c.Debounce <= 0 {
		c.Debounce = 300 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Watcher tells its owner when a plugin directory changed. It watches with
// fsnotify and also polls: OnChange runs only when the directory's
// fingerprint (every entry's name, size, mode and modification time)
// differs from the last one seen, so an event storm or a poll of an
// unchanged directory costs a stat per file and nothing else.
type Watcher struct {
	cfg  WatchConfig
	last [32]byte
}

// NewWatcher validates cfg and records the directory's current state: a
// change after NewWatcher returns is reported by Run, even one made before
// Run starts.
func NewWatcher(cfg WatchConfig) (*Watcher, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	w := &Watcher{cfg: cfg}
	fp, err := fingerprint(cfg.Dir)
	if err != nil {
		return nil, err
	}
	w.last = fp
	return w, nil
}

// Run watches until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	var events <-chan fsnotify.Event
	var errs <-chan error
	fw, err := fsnotify.NewWatcher()
	if err == nil {
		err = fw.Add(w.cfg.Dir)
	}
	if err != nil {
		w.cfg.Logger.Warn("cannot watch the plugin directory; polling it instead", "dir", w.cfg.Dir, "every", w.cfg.PollInterval, "err", err)
	} else {
		events, errs = fw.Events, fw.Errors
	}
	if fw != nil {
		defer fw.Close()
	}
	poll := time.NewTicker(w.cfg.PollInterval)
	defer poll.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	// A change made between NewWatcher and Run is reported at once.
	w.check(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			debounce.Reset(w.cfg.Debounce)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.cfg.Logger.Warn("plugin directory watch error; the poll still runs", "dir", w.cfg.Dir, "err", err)
		case <-debounce.C:
			w.check(ctx)
		case <-poll.C:
			w.check(ctx)
		}
	}
}

func (w *Watcher) check(ctx context.Context) {
	fp, err := fingerprint(w.cfg.Dir)
	if err != nil {
		w.cfg.Logger.Warn("cannot read the plugin directory", "dir", w.cfg.Dir, "err", err)
		return
	}
	if fp == w.last {
		return
	}
	w.last = fp
	w.cfg.OnChange(ctx)
}

func fingerprint(dir string) ([32]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return [32]byte{}, fmt.Errorf("plugin dir: %w", err)
	}
	h := sha256.New()
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue // removed since ReadDir; the next check sees it gone
		}
		fmt.Fprintf(h, "%s\x00%d\x00%o\x00%d\n", e.Name(), info.Size(), info.Mode(), info.ModTime().UnixNano())
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out, nil
}
