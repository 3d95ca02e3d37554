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
	mds, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	require.NoError(t, err)
	names := map[string]bool{}
	for _, md := range mds {
		b, err := os.ReadFile(md)
		require.NoError(t, err)
		for _, m := range docShotRef.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	return names
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
	srcs, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	written := map[string]bool{}
	for _, src := range srcs {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		for _, m := range shotCall.FindAllStringSubmatch(string(b), -1) {
			written[m[1]] = true
		}
	}
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
