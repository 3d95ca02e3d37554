// Package doctest reads usher's documentation, README.md and the guides
// in docs/, for the tests that run its commands as written.
//
// The documents keep one convention for their fenced blocks. A block
// marked sh is one to paste: a test reads it with [Block] and runs it as
// written, and this package's tests fail when no test reads it. A block a
// reader pastes but no test can run (make test is the tests themselves)
// says so, and why, on the line above its fence:
//
//	<!-- not run by a test: make test is the tests themselves -->
//
// A synopsis (optional parts in brackets, CAPITALS to fill in) or a
// command's output goes in a text block, which nobody pastes.
package doctest

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// NotRun starts the comment that marks a shell block no test runs; the
// reason follows it.
const NotRun = "<!-- not run by a test:"

// Root returns the module's root: the first directory above the working
// directory that holds a go.mod.
func Root(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("doctest: no go.mod above the test")
		}
		dir = parent
	}
}

// Files returns the documents, slash-separated and relative to the root:
// README.md, then docs/*.md in name order.
func Files(tb testing.TB) []string {
	tb.Helper()
	docs, err := filepath.Glob(filepath.Join(Root(tb), "docs", "*.md"))
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(docs)
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, "docs/"+filepath.Base(d))
	}
	return files
}

// Read returns the text of file, a path relative to the root
// ("README.md", "docs/operating.md").
func Read(tb testing.TB, file string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(Root(tb), filepath.FromSlash(file)))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// After returns the text of file that follows marker, the first time it
// occurs.
func After(tb testing.TB, file, marker string) string {
	tb.Helper()
	_, after, ok := strings.Cut(Read(tb, file), marker)
	if !ok {
		tb.Fatalf("%s has no %q", file, marker)
	}
	return after
}

// Block returns the lines of the first fenced block of lang (its fence's
// info string: "sh", "text", "sql"; "" for a bare fence) that follows
// marker in file.
func Block(tb testing.TB, file, marker, lang string) []string {
	tb.Helper()
	_, lines, err := find(Read(tb, file), marker, lang)
	if err != "" {
		tb.Fatalf("%s: %s", file, err)
	}
	return lines
}

// find returns where the block Block would return starts in text (the
// offset of its opening fence) and its lines, or why there is none.
func find(text, marker, lang string) (int, []string, string) {
	at := strings.Index(text, marker)
	if at < 0 {
		return 0, nil, "no " + quote(marker)
	}
	at += len(marker)
	open := "```" + lang + "\n"
	i := strings.Index(text[at:], open)
	if i < 0 {
		return 0, nil, "no " + lang + " block after " + quote(marker)
	}
	start := at + i
	block, _, ok := strings.Cut(text[start+len(open):], "```")
	if !ok {
		return 0, nil, "the " + lang + " block after " + quote(marker) + " is not closed"
	}
	return start, strings.Split(strings.TrimSpace(block), "\n"), ""
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, "\n", `\n`) + `"` }

// fence is one fenced block of a document.
type fence struct {
	offset int      // of its opening fence
	line   int      // the opening fence's, from 1
	lang   string   // its info string's first word
	lines  []string // between the fences
	notRun string   // the reason on the line above, for a block no test runs
}

// fences returns text's fenced blocks (fences at the start of a line), in
// order.
func fences(text string) []fence {
	var out []fence
	var cur *fence
	offset := 0
	prev := ""
	for n, line := range strings.SplitAfter(text, "\n") {
		trimmed := strings.TrimRight(line, "\n")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
			f := fence{offset: offset, line: n + 1}
			if len(info) > 0 {
				f.lang = info[0]
			}
			if reason, ok := strings.CutPrefix(strings.TrimSpace(prev), NotRun); ok {
				f.notRun = strings.TrimSpace(strings.TrimSuffix(reason, "-->"))
			}
			cur = &f
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, trimmed)
		}
		offset += len(line)
		prev = line
	}
	return out
}
