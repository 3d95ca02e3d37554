package pluginhost

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/usherhq/usher/internal/contract"
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
	// Migrations is a directory beside the manifest (a plain name, never
	// a path) of goose-style NNNNN_name.sql files: the plugin's own
	// tables, applied in its schema plugin_<name> (package plugindb).
	// Optional.
	Migrations string `json:"migrations,omitempty"`
	// MigrationsSHA256 is MigrationsSHA256 of that directory: an install
	// refuses files that do not match it. Required with Migrations.
	MigrationsSHA256 string `json:"migrations_sha256,omitempty"`
	// Grants are the plugin's privileges on tables outside its own
	// schema (the application's), column by column. An install grants
	// exactly these and revokes what is no longer listed.
	Grants []Grant `json:"grants,omitempty"`
}

// Grant is a plugin's privileges on one table outside its own schema.
type Grant struct {
	// Table is the table, schema-qualified ("app.wallets") or in the
	// database's current schema ("wallets").
	Table string `json:"table"`
	// Select, Update and Insert name the columns of each privilege.
	Select []string `json:"select,omitempty"`
	Update []string `json:"update,omitempty"`
	Insert []string `json:"insert,omitempty"`
}

// validate refuses a grant that names no table, no column, or anything
// that is not a plain SQL identifier.
func (g Grant) validate() error {
	parts := strings.Split(g.Table, ".")
	if len(parts) > 2 {
		return fmt.Errorf("grant on %q: a table is NAME or SCHEMA.NAME", g.Table)
	}
	for _, p := range parts {
		if !identifier(p) {
			return fmt.Errorf("grant on %q: %q is not a plain SQL identifier (lower-case letters, digits and _)", g.Table, p)
		}
	}
	if len(g.Select)+len(g.Update)+len(g.Insert) == 0 {
		return fmt.Errorf("grant on %q names no column", g.Table)
	}
	for _, cols := range [][]string{g.Select, g.Update, g.Insert} {
		for _, c := range cols {
			if !identifier(c) {
				return fmt.Errorf("grant on %q: column %q is not a plain SQL identifier (lower-case letters, digits and _)", g.Table, c)
			}
		}
	}
	return nil
}

// identifier is a name that needs no quoting: lower-case letters, digits
// and _, not starting with a digit.
func identifier(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// MigrationsDir is the manifest's migrations directory in dir (the
// manifest's directory), or "" when it has none.
func (m FileManifest) MigrationsDir(dir string) string {
	if m.Migrations == "" {
		return ""
	}
	return filepath.Join(dir, m.Migrations)
}

// MigrationsSHA256 is the checksum of a plugin's migrations: SHA-256,
// lower-case hex, over every *.sql file directly in fsys, in byte order of
// their names, each as its name, a NUL byte, its length in decimal, a NUL
// byte and its content. Other files do not count (and are never applied).
func MigrationsSHA256(fsys fs.FS) (string, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", fmt.Errorf("migrations: %w", err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ReadGrants reads a JSON array of grants (the manifest's "grants") from
// path: `host plugins manifest --grants FILE`.
func ReadGrants(path string) ([]Grant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var gs []Grant
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&gs); err != nil {
		return nil, fmt.Errorf("grants %s: %w", path, err)
	}
	for _, g := range gs {
		if err := g.validate(); err != nil {
			return nil, fmt.Errorf("grants %s: %w", path, err)
		}
	}
	return gs, nil
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
	switch {
	case m.Migrations != "" && (m.Migrations != filepath.Base(m.Migrations) || m.Migrations == "." || m.Migrations == ".."):
		return fmt.Errorf("manifest of %s: migrations %q must be a directory name in the manifest's directory", m.Name, m.Migrations)
	case m.Migrations != "" && !sha256Hex(m.MigrationsSHA256):
		return fmt.Errorf("manifest of %s: migrations_sha256 %q is not 64 lower-case hex digits (host plugins manifest --migrations DIR computes it)", m.Name, m.MigrationsSHA256)
	case m.Migrations == "" && m.MigrationsSHA256 != "":
		return fmt.Errorf("manifest of %s has a migrations_sha256 but no migrations", m.Name)
	}
	for _, g := range m.Grants {
		if err := g.validate(); err != nil {
			return fmt.Errorf("manifest of %s: %w", m.Name, err)
		}
	}
	return nil
}

func sha256Hex(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 32 && s == strings.ToLower(s)
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
		slices.Equal(p.Manifest.Kinds, q.Manifest.Kinds) && slices.Equal(p.Manifest.Enqueues, q.Manifest.Enqueues) &&
		p.Manifest.Migrations == q.Manifest.Migrations && p.Manifest.MigrationsSHA256 == q.Manifest.MigrationsSHA256 &&
		slices.EqualFunc(p.Manifest.Grants, q.Manifest.Grants, func(a, b Grant) bool {
			return a.Table == b.Table && slices.Equal(a.Select, b.Select) && slices.Equal(a.Update, b.Update) && slices.Equal(a.Insert, b.Insert)
		})
}

// Probe starts the binary at path in a scratch directory, reads what it
// reports (name, version, kinds) and stops it: a manifest written for a
// binary must say what the binary itself says. The plugin is told it is
// only asked its manifest (contract.ManifestOnlyEnv), so one that refuses
// to start without its settings still answers.
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
	inst, err := Start(ctx, Config{Path: path, Dir: dir, Host: usherv1.UnimplementedHostServer{}, Env: []string{contract.ManifestOnlyEnv + "=1"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return Manifest{}, err
	}
	defer inst.Kill()
	return inst.Manifest(), nil
}
