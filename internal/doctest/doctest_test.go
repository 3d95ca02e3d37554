package doctest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// shell is the info strings of a block a reader pastes into a shell.
var shell = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true, "zsh": true}

// reader is a call of Block in some test: the test that reads a block.
type reader struct {
	at                 string // file:line of the call
	file, marker, lang string
}

// readers returns every call of doctest.Block in the module's tests, with
// its arguments, which must be literals so that this check can see which
// block each reads.
func readers(t *testing.T) []reader {
	t.Helper()
	root := Root(t)
	var out []reader
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "testdata", "node_modules", "bench-results":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Block" {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "doctest" || len(call.Args) != 4 {
				return true
			}
			pos := fset.Position(call.Pos())
			rel, _ := filepath.Rel(root, pos.Filename)
			r := reader{at: fmt.Sprintf("%s:%d", filepath.ToSlash(rel), pos.Line)}
			var args []string
			for _, a := range call.Args[1:] {
				lit, ok := a.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Errorf("%s: doctest.Block's file, marker and lang must be literals, for this check to see the block", r.at)
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				args = append(args, s)
			}
			r.file, r.marker, r.lang = args[0], args[1], args[2]
			out = append(out, r)
			return true
		})
		return nil
	})
	require.NoError(t, err)
	return out
}

// Every shell block of README.md and docs/*.md is read by a test (which
// runs it as written), or says on the line above its fence why none does;
// and every block a test reads is where that test looks for it, so a
// moved section fails here even when the test that reads it is skipped.
func TestShellBlocksAreRun(t *testing.T) {
	t.Parallel()
	readBy := map[string][]string{} // "file@offset" -> the calls reading it
	for _, r := range readers(t) {
		start, _, why := find(Read(t, r.file), r.marker, r.lang)
		if why != "" {
			t.Errorf("%s reads %s: %s", r.at, r.file, why)
			continue
		}
		key := fmt.Sprintf("%s@%d", r.file, start)
		readBy[key] = append(readBy[key], r.at)
	}
	shells := 0
	for _, file := range Files(t) {
		for _, f := range fences(Read(t, file)) {
			if !shell[f.lang] {
				continue
			}
			shells++
			by := readBy[fmt.Sprintf("%s@%d", file, f.offset)]
			switch {
			case f.notRun != "" && len(by) > 0:
				t.Errorf("%s:%d: marked %q, but %s reads it", file, f.line, f.notRun, strings.Join(by, ", "))
			case f.notRun == "" && len(by) == 0:
				t.Errorf("%s:%d: a %s block no test runs (%q): run it from a test with doctest.Block, make it a text block if it is not to paste, or say why above its fence (%s why -->)",
					file, f.line, f.lang, firstLine(f), NotRun)
			}
		}
	}
	require.Greater(t, shells, 20, "the documents' shell blocks")
}

func firstLine(f fence) string {
	if len(f.lines) == 0 {
		return ""
	}
	return f.lines[0]
}

// A shell block is one to paste: no line of it is a synopsis (an optional
// part in brackets, "A | B"), which the shell would take as arguments.
// Synopses go in text blocks (docs/operating.md's).
func TestShellBlocksHaveNoSynopsis(t *testing.T) {
	t.Parallel()
	synopsis := regexp.MustCompile(`\[(--|[A-Z]|[a-z]+\])| \| --`)
	blocks := 0
	for _, file := range Files(t) {
		for _, f := range fences(Read(t, file)) {
			if !shell[f.lang] {
				continue
			}
			blocks++
			for _, line := range f.lines {
				code, _, _ := strings.Cut(line, "  #")
				require.False(t, synopsis.MatchString(code), "%s:%d: a synopsis in a shell block: %s", file, f.line, line)
			}
		}
	}
	require.Greater(t, blocks, 10)
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`(?m)^\[[^\]]+\]:\s*(\S+)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	heading    = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
)

// Every relative link of README.md and docs/*.md (and image) names a file
// of the repository, and a #heading in a Markdown file one of its
// headings.
func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	root := Root(t)
	links := 0
	for _, file := range Files(t) {
		for n, line := range prose(Read(t, file)) {
			line = codeSpan.ReplaceAllString(line, "")
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			for _, m := range refLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				p, anchor, _ := strings.Cut(target, "#")
				dest := file
				if p != "" {
					dest = path.Clean(path.Join(path.Dir(file), p))
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
					t.Errorf("%s:%d: %s: no file %s", file, n+1, target, dest)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[anchor] {
					t.Errorf("%s:%d: %s: %s has no heading #%s", file, n+1, target, dest, anchor)
				}
			}
		}
	}
	require.Greater(t, links, 10, "the documents link to each other")
}

// prose returns text's lines with those of fenced blocks blanked, so that
// line numbers stay the file's.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// anchors returns the anchors GitHub gives file's headings: lower case,
// punctuation dropped, spaces as hyphens, a repeated one numbered.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(strings.Join(prose(Read(t, file)), "\n"), -1) {
		a := slug(m[1])
		for i := 1; out[a]; i++ {
			a = fmt.Sprintf("%s-%d", slug(m[1]), i)
		}
		out[a] = true
	}
	return out
}

func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	t.Parallel()
	require.Equal(t, "the-plugin-boundary-database-roles", slug("The plugin boundary: database roles"))
	require.Equal(t, "your-plugins-schema-and-grants", slug("Your plugin's schema and grants"))
	require.Equal(t, "1-10-and-100-hosts", slug("1, 10 and 100 hosts"))
	require.Equal(t, "redis-acl-and-tls", slug("Redis ACL and TLS"))
}
