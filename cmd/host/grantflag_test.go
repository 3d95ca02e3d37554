package main

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A malformed --grant or --migrations is refused with what is wrong, and
// no manifest is written.
func TestManifestRefusesBadGrantsAndMigrations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := countersCopy(t, dir)
	elsewhere := t.TempDir()
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--grant", "events"}, "want TABLE:select=a,b;update=c;insert=d"},
		{[]string{"--grant", "events:"}, "want TABLE:select=a,b;update=c;insert=d"},
		{[]string{"--grant", "events:select"}, `"select" is not PRIVILEGE=col,col`},
		{[]string{"--grant", "events:delete=id"}, `privilege "delete" is not select, update or insert`},
		{[]string{"--grant", "events; DROP TABLE orders:select=id"}, "events; DROP TABLE orders"},
		{[]string{"--grant", "events:select=id,Seats_Sold"}, `"Seats_Sold" is not a plain SQL identifier`},
		{[]string{"--grants", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"--migrations", elsewhere}, "must be a directory beside the binary"},
	} {
		cl := &cli{stdout: io.Discard, stderr: io.Discard, now: time.Now}
		args := append([]string{"plugins", "manifest", bin, "--name", "counters", "--version", "1.0.0", "--kind", "update_sales_counter", "--write"}, c.flags...)
		err := cl.run(context.Background(), args)
		require.ErrorContains(t, err, c.want, "%q", c.flags)
		require.NoFileExists(t, filepath.Join(dir, "counters.plugin.json"), "%q wrote a manifest", c.flags)
	}
}
