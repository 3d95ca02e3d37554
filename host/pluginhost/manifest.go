package pluginhost

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// ManifestSuffix ends the name of every manifest file in a plugin
// directory: counters.plugin.json describes the binary "counters".
const ManifestSuffix = ".plugin.json"

// FileManifest is the small file of ours that makes a binary in a plugin
// directory a plugin: its name and version (which the running plugin must
// report), the binary beside it, and the binary's SHA-256, which go-plugin
// checks before starting the process.
type FileManifest struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Binary is a file name in the manifest's directory, never a path:
	// a manifest cannot point the host at a binary elsewhere.
	Binary string `json:"binary"`
	// SHA256 is the binary's checksum, lower-case hex.
	SHA256 string `json:"sha256"`
	// Kinds are the kinds the plugin serves: a running plugin that
	// declares any other is refused, and each is pinned to the plugin's
	// database role. At least one.
	Kinds []string `json:"kinds"`
	// Enqueues are kinds of other plugins its handlers may enqueue; a
	// plugin may always enqueue its own kinds.
	Enqueues []string `json:"enqueues,omitempty"`
}

// NewFileManifest describes the binary at path as plugin name at version,
// serving kinds, with the binary's current SHA-256.
func NewFileManifest(path, name, version string, kinds []string) (FileManifest, error) {
	sum, err := FileSHA256(path)
	if err != nil {
		return FileManifest{}, err
	}
	m := FileManifest{Name: name, Version: version, Binary: filepath.Base(path), SHA256: sum, Kinds: kinds}
	return m, m.validate()
}

// CheckKinds refuses a running plugin whose declared kinds are not the
// manifest's.
func (m FileManifest) CheckKinds(declared []string) error {
	listed := map[string]bool{}
	for _, k := range m.Kinds {
		listed[k] = true
	}
	var extra []string
	for _, k := range declared {
		if !listed[k] {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("plugin %s declares kinds its manifest does not list: %s (the manifest lists %s)",
			m.Name, strings.Join(extra, ", "), strings.Join(m.Kinds, ", "))
	}
	return nil
}

// ManifestPath is where m is written in dir: <dir>/<name>.plugin.json.
func (m FileManifest) ManifestPath(dir string) string {
	return filepath.Join(dir, m.Name+ManifestSuffix)
}

// Write writes m into dir as <name>.plugin.json and returns the file's path.
// The file is written under a temporary name and renamed, so a watching
// host never reads half a manifest.
func (m FileManifest) Write(dir string) (string, error) {
	if err := m.validate(); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	path := m.ManifestPath(dir)
	tmp, err := os.CreateTemp(dir, "."+m.Name+"-*.tmp")
	if err != nil {
		return "", fmt.Errorf("write manifest: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write manifest: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write manifest: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("write manifest: %w", err)
	}
	return path, nil
}

// Checksum returns the decoded SHA-256.
func (m FileManifest) Checksum() ([]byte, error) {
	b, err := hex.DecodeString(m.SHA256)
	if err != nil || len(b) != 32 {
		return nil, fmt.Errorf("sha256 %q is not 64 hex digits", m.SHA256)
	}
	return b, nil
}

func (m FileManifest) validate() error {
	switch {
	case m.Name == "":
		return errors.New("manifest has no name")
	case strings.ContainsAny(m.Name, `/\`) || strings.HasPrefix(m.Name, "."):
		return fmt.Errorf("manifest name %q is not a plain name", m.Name)
	case m.Version == "":
		return fmt.Errorf("manifest of %s has no version", m.Name)
	case m.Binary == "" || m.Binary != filepath.Base(m.Binary) || m.Binary == "." || m.Binary == "..":
		return fmt.Errorf("manifest of %s: binary %q must be a file name in the manifest's directory", m.Name, m.Binary)
	case len(m.Kinds) == 0:
		return fmt.Errorf("manifest of %s lists no kinds: name each kind the plugin serves (host plugins manifest --kind K)", m.Name)
	}
	for _, k := range append(append([]string{}, m.Kinds...), m.Enqueues...) {
		if k == "" {
			return fmt.Errorf("manifest of %s lists an empty kind", m.Name)
		}
	}
	_, err := m.Checksum()
	if err != nil {
		return fmt.Errorf("manifest of %s: %w", m.Name, err)
	}
	return nil
}

// ReadManifest reads and validates the manifest file at path.
func ReadManifest(path string) (FileManifest, error) {
	var m FileManifest
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("manifest %s: %w", path, err)
	}
	if err := m.validate(); err != nil {
		return m, fmt.Errorf("manifest %s: %w", path, err)
	}
	return m, nil
}

// DirPlugin is one manifest found in a plugin directory.
type DirPlugin struct {
	// Manifest is the manifest's content.
	Manifest FileManifest
	// ManifestPath is the manifest file; BinaryPath the binary it names.
	ManifestPath, BinaryPath string
}

// Config returns the start configuration for the plugin, with base's Host,
// Logger, Env and Stderr: the binary, its expected checksum, name and
// version.
func (p DirPlugin) Config(base Config) (Config, error) {
	sum, err := p.Manifest.Checksum()
	if err != nil {
		return Config{}, err
	}
	base.Path, base.SHA256 = p.BinaryPath, sum
	base.Name, base.Version = p.Manifest.Name, p.Manifest.Version
	return base, nil
}

// DirScan is what ScanDir found.
type DirScan struct {
	// Plugins holds the valid manifests, sorted by name.
	Plugins []DirPlugin
	// Problems lists what was skipped and why: an unreadable or invalid
	// manifest, two manifests naming one plugin, a manifest whose binary
	// is missing, an executable that no manifest names.
	Problems []error
}

// ScanDir reads every manifest in dir. It never starts anything: a bad
// manifest or an executable without one is reported in Problems and
// skipped, and the rest are returned.
func ScanDir(dir string) (DirScan, error) {
	var out DirScan
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out, fmt.Errorf("plugin dir: %w", err)
	}
	named := map[string]bool{}
	byName := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ManifestSuffix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		m, err := ReadManifest(path)
		if err != nil {
			out.Problems = append(out.Problems, err)
			continue
		}
		if other, dup := byName[m.Name]; dup {
			out.Problems = append(out.Problems, fmt.Errorf("manifests %s and %s both name plugin %q; skipping %s", other, path, m.Name, path))
			continue
		}
		bin := filepath.Join(dir, m.Binary)
		named[m.Binary] = true
		if _, err := os.Stat(bin); err != nil {
			out.Problems = append(out.Problems, fmt.Errorf("manifest %s: binary: %w", path, err))
			continue
		}
		byName[m.Name] = path
		out.Plugins = append(out.Plugins, DirPlugin{Manifest: m, ManifestPath: path, BinaryPath: bin})
	}
	for _, e := range entries {
		if e.IsDir() || named[e.Name()] || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if info, err := e.Info(); err == nil && info.Mode()&0o111 != 0 {
			out.Problems = append(out.Problems, fmt.Errorf("%s is executable but no manifest names it; ignored (write one with `host plugins manifest`)",
				filepath.Join(dir, e.Name())))
		}
	}
	sort.Slice(out.Plugins, func(i, j int) bool { return out.Plugins[i].Manifest.Name < out.Plugins[j].Manifest.Name })
	return out, nil
}

// Same reports whether p and q are the same manifest for the same binary.
func (p DirPlugin) Same(q DirPlugin) bool {
	return p.ManifestPath == q.ManifestPath && p.BinaryPath == q.BinaryPath &&
		p.Manifest.Name == q.Manifest.Name && p.Manifest.Version == q.Manifest.Version &&
		p.Manifest.Binary == q.Manifest.Binary && p.Manifest.SHA256 == q.Manifest.SHA256 &&
		slices.Equal(p.Manifest.Kinds, q.Manifest.Kinds) && slices.Equal(p.Manifest.Enqueues, q.Manifest.Enqueues)
}

// Probe starts the binary at path in a scratch directory, reads what it
// reports (name, version, kinds) and stops it: a manifest written for a
// binary must say what the binary itself says.
func Probe(ctx context.Context, path string) (Manifest, error) {
	path, err := filepath.Abs(path) // it runs elsewhere
	if err != nil {
		return Manifest{}, err
	}
	dir, err := os.MkdirTemp("", "usher-probe-")
	if err != nil {
		return Manifest{}, err
	}
	defer os.RemoveAll(dir)
	inst, err := Start(ctx, Config{Path: path, Dir: dir, Host: usherv1.UnimplementedHostServer{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return Manifest{}, err
	}
	defer inst.Kill()
	return inst.Manifest(), nil
}
