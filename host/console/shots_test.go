package console_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// docsConsole is docs/console, seen from this package's directory (where
// go test runs its tests): the screenshots docs/operating.md shows.
var docsConsole = filepath.Join("..", "..", "docs", "console")

// docShotRef is a link from the docs to one of docs/console's screenshots.
var docShotRef = regexp.MustCompile(`console/([a-z0-9-]+)\.png`)

// docShots are the screenshots docs/*.md show, by name (no .png).
func docShots(t testing.TB) map[string]bool {
	t.Helper()
	return matchesIn(t, filepath.Join("..", "..", "docs", "*.md"), docShotRef)
}

// matchesIn is the first submatch of every match of re in the files of
// glob.
func matchesIn(t testing.TB, glob string, re *regexp.Regexp) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(glob)
	require.NoError(t, err)
	found := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			found[m[1]] = true
		}
	}
	return found
}

// shot writes the page bctx shows, whole, as NAME.png into the artifacts
// directory (artifacts). `make screenshots` points that at docs/console:
// there only the shots the docs show are written, so the directory holds
// exactly what docs/*.md links (TestDocShotsComeFromTests).
func shot(t *testing.T, bctx context.Context, name string) {
	t.Helper()
	dir := artifacts(t)
	if sameDir(t, dir, docsConsole) && !docShots(t)[name] {
		return
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot "+name)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

func sameDir(t *testing.T, a, b string) bool {
	t.Helper()
	sa, err := os.Stat(a)
	require.NoError(t, err)
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// shotCall is a test's call of shot with a literal name.
var shotCall = regexp.MustCompile(`\bshot\([^()]*?"([a-z0-9-]+)"\)`)

// Every screenshot the docs show is one a browser test writes (by a
// literal name, so `make screenshots` makes it), and docs/console holds no
// other: a picture no test writes would go stale unseen.
func TestDocShotsComeFromTests(t *testing.T) {
	t.Parallel()
	written := matchesIn(t, "*_test.go", shotCall)
	docs := docShots(t)
	require.NotEmpty(t, docs)
	for name := range docs {
		require.True(t, written[name], "docs show console/%s.png, which no browser test writes (shot(t, bctx, %q))", name, name)
	}
	pngs, err := filepath.Glob(filepath.Join(docsConsole, "*.png"))
	require.NoError(t, err)
	var stray []string
	for _, p := range pngs {
		if name := filepath.Base(p); !docs[name[:len(name)-len(".png")]] {
			stray = append(stray, name)
		}
	}
	sort.Strings(stray)
	require.Empty(t, stray, "docs/console holds pictures the docs do not show: remove them (make screenshots does)")
}
