package pluginhost

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), mode))
}

// ScanDir returns the valid manifests and says why it skipped the rest.
func TestScanDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "good"), "#!/bin/sh\n", 0o755)
	m, err := NewFileManifest(filepath.Join(dir, "good"), "good", "1.2.3", []string{"good_job"})
	require.NoError(t, err)
	path, err := m.Write(dir)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "good.plugin.json"), path)

	writeFile(t, filepath.Join(dir, "stray"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(dir, "notes.txt"), "not a plugin\n", 0o644)
	writeFile(t, filepath.Join(dir, "broken.plugin.json"), `{"name":"broken",`, 0o644)
	writeFile(t, filepath.Join(dir, "escape.plugin.json"),
		`{"name":"escape","version":"1","binary":"../../bin/sh","sha256":"`+strings.Repeat("a", 64)+`","kinds":["k"]}`, 0o644)
	writeFile(t, filepath.Join(dir, "missing.plugin.json"),
		`{"name":"missing","version":"1","binary":"missing","sha256":"`+strings.Repeat("a", 64)+`","kinds":["k"]}`, 0o644)
	writeFile(t, filepath.Join(dir, "shortsum.plugin.json"), `{"name":"shortsum","version":"1","binary":"good","sha256":"abc","kinds":["k"]}`, 0o644)
	writeFile(t, filepath.Join(dir, "extra.plugin.json"),
		`{"name":"extra","version":"1","binary":"good","sha256":"`+strings.Repeat("a", 64)+`","kinds":["k"],"path":"/x"}`, 0o644)
	writeFile(t, filepath.Join(dir, "zz-twin.plugin.json"),
		`{"name":"good","version":"1","binary":"good","sha256":"`+strings.Repeat("a", 64)+`","kinds":["k"]}`, 0o644)

	scan, err := ScanDir(dir)
	require.NoError(t, err)
	require.Len(t, scan.Plugins, 1)
	got := scan.Plugins[0]
	require.Equal(t, m, got.Manifest)
	require.Equal(t, filepath.Join(dir, "good"), got.BinaryPath)

	var problems []string
	for _, p := range scan.Problems {
		problems = append(problems, p.Error())
	}
	all := strings.Join(problems, "\n")
	for _, want := range []string{
		"broken.plugin.json: unexpected EOF",
		`binary "../../bin/sh" must be a file name in the manifest's directory`,
		"missing.plugin.json: binary: stat",
		`sha256 "abc" is not 64 hex digits`,
		`unknown field "path"`,
		`both name plugin "good"`,
		"stray is executable but no manifest names it; ignored",
	} {
		require.Contains(t, all, want)
	}
	require.NotContains(t, all, "notes.txt", "a file that is not executable is not a plugin")
	require.Len(t, scan.Problems, 7)
}

func TestDirPluginConfig(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("0f", 32)
	p := DirPlugin{Manifest: FileManifest{Name: "n", Version: "v", Binary: "b", SHA256: sum, Kinds: []string{"k"}}, BinaryPath: "/d/b"}
	cfg, err := p.Config(Config{Env: []string{"A=1"}})
	require.NoError(t, err)
	require.Equal(t, "/d/b", cfg.Path)
	require.Equal(t, "n", cfg.Name)
	require.Equal(t, "v", cfg.Version)
	require.Len(t, cfg.SHA256, 32)
	require.Equal(t, []string{"A=1"}, cfg.Env)
}

// go-plugin's refusal of a plugin built for another protocol becomes one
// that names the versions the host speaks.
func TestProtocolError(t *testing.T) {
	t.Parallel()
	goPluginErr := errors.New("incompatible API version with plugin. Plugin version: 7, Client versions: [1]")
	err, ok := protocolError(goPluginErr)
	require.True(t, ok)
	require.ErrorIs(t, err, goPluginErr)
	require.Contains(t, err.Error(), "the plugin speaks host-plugin protocol 7, this host speaks protocol 1")
	_, ok = protocolError(errors.New("something else"))
	require.False(t, ok)
	require.Equal(t, []int{1}, Protocols())
}

// The watcher reports a change once, and a directory that did not change
// not at all, however often it polls.
func TestWatcher(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var changes atomic.Int64
	w, err := NewWatcher(WatchConfig{Dir: dir, PollInterval: 20 * time.Millisecond, Debounce: 20 * time.Millisecond,
		OnChange: func(context.Context) { changes.Add(1) }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	// No event to wait for: give it several polls of an unchanged directory.
	time.Sleep(100 * time.Millisecond)
	require.EqualValues(t, 0, changes.Load())
	// Written elsewhere and renamed in, so no poll sees half of it.
	tmp := filepath.Join(t.TempDir(), "x")
	writeFile(t, tmp, "{}", 0o644)
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "x.plugin.json")))
	deadline := time.Now().Add(5 * time.Second)
	for changes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.EqualValues(t, 1, changes.Load())
	time.Sleep(100 * time.Millisecond)
	require.EqualValues(t, 1, changes.Load(), "one change, one call")
}
