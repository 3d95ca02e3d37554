package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"text/template"

	"golang.org/x/mod/modfile"

	"github.com/usherhq/usher/host/sandbox"
)

// pluginTemplate is the module `host plugins init` writes: every file is a
// text/template ending in .tmpl (so the go tool does not read the
// templates as this module's code), written without that suffix. Its
// actions are delimited by [[ ]]: Go's composite literals are full of {{.
//
//go:embed plugintemplate
var pluginTemplate embed.FS

// usherModule is the module a plugin requires.
const usherModule = "github.com/usherhq/usher"

// zeroVersion is the version a go.mod requires of a module a replace
// directive stands in for, or that must be fixed before go mod tidy.
const zeroVersion = "v0.0.0-00010101000000-000000000000"

// templateData is what the templates see.
type templateData struct {
	Name, Module, EnvPrefix string
	GoVersion, UsherVersion string
	// UsherDir, when set, is the usher checkout the module's go.mod
	// replaces github.com/usherhq/usher with (an absolute path), and
	// UsherDirMod the same quoted as go.mod needs.
	UsherDir, UsherDirMod string
	// UsherUnknown: this host knows neither its usher version nor a
	// checkout, and UsherVersion is the zero pseudo-version a replace or
	// a go get must fix.
	UsherUnknown bool
}

func (cl *cli) pluginsInit(fs *flag.FlagSet) runner {
	dir := fs.String("dir", "", "the directory to write the module to: new, or empty (default ./NAME)")
	module := fs.String("module", "", "the module path (default example.com/NAME)")
	usherDir := fs.String("usher-dir", "", "a source checkout of usher, which the module's go.mod replaces github.com/usherhq/usher with "+
		"(default: for a host built from source, the checkout above its executable or the working directory; for a released host, none: it requires its own version)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("usage: host plugins init NAME [--dir DIR] [--module PATH] [--usher-dir DIR]; got %d arguments %q", len(pos), pos)}
		}
		name := pos[0]
		if err := sandbox.CheckPluginName(name); err != nil {
			return usageError{err.Error()}
		}
		d := templateData{Name: name, Module: *module, EnvPrefix: strings.ToUpper(name), GoVersion: goVersion()}
		if d.Module == "" {
			d.Module = "example.com/" + name
		}
		if err := checkModulePath(d.Module); err != nil {
			return usageError{err.Error()}
		}
		checkout, err := usherSource(*usherDir)
		if err != nil {
			return usageError{err.Error()}
		}
		switch version, released := releasedVersion(); {
		case checkout != "":
			d.UsherVersion, d.UsherDir, d.UsherDirMod = zeroVersion, checkout, modfile.AutoQuote(checkout)
		case released:
			d.UsherVersion = version
		default:
			d.UsherVersion, d.UsherUnknown = zeroVersion, true
		}
		out := *dir
		if out == "" {
			out = name
		}
		if err := writePluginModule(out, d); err != nil {
			return err
		}
		fmt.Fprintf(cl.stdout, "wrote plugin %s (module %s) to %s\n", name, d.Module, out)
		switch {
		case checkout != "":
			fmt.Fprintf(cl.stdout, "its go.mod replaces %s with the checkout %s\n", usherModule, checkout)
		case d.UsherUnknown:
			fmt.Fprintf(cl.stdout, "this host was built from source and found no usher checkout above its executable or the working directory: "+
				"in %s, go mod edit -replace %s=/path/to/usher (or run init again with --usher-dir /path/to/usher)\n", out, usherModule)
		}
		fmt.Fprintf(cl.stdout, "next: cd %s && go mod tidy && make test (make test needs USHER_TEST_DATABASE_URL: its README.md, Test)\n", out)
		return nil
	}
}

// usherSource is the usher checkout a new module's go.mod replaces usher
// with, as an absolute path: flagDir when given, which must be one; else,
// for a host built from source, the checkout found above its executable or
// above the working directory; else none ("").
func usherSource(flagDir string) (string, error) {
	if flagDir != "" {
		abs, err := filepath.Abs(flagDir)
		if err != nil {
			return "", fmt.Errorf("--usher-dir %s: %w", flagDir, err)
		}
		b, err := os.ReadFile(filepath.Join(abs, "go.mod"))
		if err != nil {
			return "", fmt.Errorf("--usher-dir %s is not a source checkout of usher: %w", flagDir, err)
		}
		if m := modfile.ModulePath(b); m != usherModule {
			return "", fmt.Errorf("--usher-dir %s is not a source checkout of usher: its go.mod declares module %q, not %s", flagDir, m, usherModule)
		}
		return abs, nil
	}
	if _, released := releasedVersion(); released {
		return "", nil
	}
	var starts []string
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			starts = append(starts, filepath.Dir(exe))
		}
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, start := range starts {
		if dir := enclosingUsher(start); dir != "" {
			return dir, nil
		}
	}
	return "", nil
}

// enclosingUsher is the root of the module dir is in when that module is
// usher, else "".
func enclosingUsher(dir string) string {
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if modfile.ModulePath(b) == usherModule {
				return dir
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// writePluginModule renders the template into dir, which must not exist or
// be empty: init never overwrites a file.
func writePluginModule(dir string, d templateData) error {
	entries, err := os.ReadDir(dir)
	switch {
	case err == nil && len(entries) > 0:
		return fmt.Errorf("%s exists and is not empty: plugins init writes a new module into a new or empty directory", dir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	}
	// Render everything before writing anything: a template error leaves
	// no half-written module.
	files := map[string][]byte{}
	err = fs.WalkDir(pluginTemplate, "plugintemplate", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		src, err := pluginTemplate.ReadFile(p)
		if err != nil {
			return err
		}
		t, err := template.New(p).Delims("[[", "]]").Option("missingkey=error").Parse(string(src))
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, d); err != nil {
			return err
		}
		files[strings.TrimSuffix(strings.TrimPrefix(p, "plugintemplate/"), ".tmpl")] = b.Bytes()
		return nil
	})
	if err != nil {
		return fmt.Errorf("plugin template: %w", err)
	}
	for rel, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkModulePath refuses what go.mod would not take as a module path:
// slash-separated elements of letters, digits and -._~, none empty or a dot.
func checkModulePath(p string) error {
	bad := p == "" || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/")
	for _, elem := range strings.Split(p, "/") {
		bad = bad || elem == "" || elem == "." || elem == ".." || strings.HasPrefix(elem, ".") || path.Clean(elem) != elem
		for _, c := range elem {
			bad = bad || !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-._~", c))
		}
	}
	if bad {
		return fmt.Errorf("module path %q is refused: its elements are letters, digits and -._~, separated by /", p)
	}
	return nil
}

// goVersion is the go directive of the generated go.mod: the toolchain this
// host was built with, as go.mod writes it (go1.26.8 -> 1.26.8).
func goVersion() string {
	v, _, _ := strings.Cut(strings.TrimPrefix(runtime.Version(), "go"), " ")
	if v == "" || !strings.ContainsAny(v[:1], "0123456789") {
		return "1.26"
	}
	return v
}

// releasedVersion is the version of usher this host was built as when it
// is a released one (`go install github.com/usherhq/usher/cmd/host@v1.2.0`),
// which a new module can require. A build in a checkout is not: its
// version is "(devel)", or one the go command derived from the checkout's
// commit (vcs.revision), which no module proxy serves.
func releasedVersion() (v string, released bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", false
	}
	return releasedVersionOf(bi)
}

func releasedVersionOf(bi *debug.BuildInfo) (v string, released bool) {
	if bi.Main.Path != usherModule || !strings.HasPrefix(bi.Main.Version, "v") {
		return "", false
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return "", false
		}
	}
	return bi.Main.Version, true
}
