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

// templateData is what the templates see.
type templateData struct {
	Name, Module, EnvPrefix string
	GoVersion, UsherVersion string
	// UsherUnknown: this host does not know its usher version, and
	// UsherVersion is the zero pseudo-version a replace must fix.
	UsherUnknown bool
}

func (cl *cli) pluginsInit(fs *flag.FlagSet) runner {
	dir := fs.String("dir", "", "the directory to write the module to: new, or empty (default ./NAME)")
	module := fs.String("module", "", "the module path (default example.com/NAME)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("usage: host plugins init NAME [--dir DIR] [--module PATH]; got %d arguments %q", len(pos), pos)}
		}
		name := pos[0]
		if err := sandbox.CheckPluginName(name); err != nil {
			return usageError{err.Error()}
		}
		d := templateData{Name: name, Module: *module, EnvPrefix: strings.ToUpper(name), GoVersion: goVersion()}
		d.UsherVersion, d.UsherUnknown = usherVersion()
		if d.Module == "" {
			d.Module = "example.com/" + name
		}
		if err := checkModulePath(d.Module); err != nil {
			return usageError{err.Error()}
		}
		out := *dir
		if out == "" {
			out = name
		}
		if err := writePluginModule(out, d); err != nil {
			return err
		}
		fmt.Fprintf(cl.stdout, "wrote plugin %s (module %s) to %s\n", name, d.Module, out)
		if d.UsherUnknown {
			fmt.Fprintf(cl.stdout, "this host does not know its usher version: in %s, go get github.com/usherhq/usher@VERSION, or go mod edit -replace github.com/usherhq/usher=/path/to/usher\n", out)
		}
		fmt.Fprintf(cl.stdout, "next: cd %s && go mod tidy && make test\n", out)
		return nil
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

// usherVersion is the version of usher this host was built from when the
// build knows it (a `go install ...@v1.2.0`); else the zero pseudo-version,
// which a replace directive or `go get github.com/usherhq/usher@VERSION`
// must then fix, and unknown is true.
func usherVersion() (v string, unknown bool) {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Path == usherModule &&
		strings.HasPrefix(bi.Main.Version, "v") {
		return bi.Main.Version, false
	}
	return "v0.0.0-00010101000000-000000000000", true
}
