package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/pluginhost"
)

// A kept copy is named by its SHA-256, verified, read-only and executable
// by any user in a directory others cannot list; it does not change when
// the file it was copied from does; the same bytes are kept once, and a
// copy goes when the last version referring to it gives it back.
func TestKeepContentAddressed(t *testing.T) {
	t.Parallel()
	var k keeper
	t.Cleanup(k.removeAll)
	src := filepath.Join(t.TempDir(), "counters")
	v1 := []byte("#!/bin/sh\necho v1\n")
	require.NoError(t, os.WriteFile(src, v1, 0o755))
	sum1 := sha256.Sum256(v1)

	a, err := k.keep(pluginhost.Config{Path: src, SHA256: sum1[:]})
	require.NoError(t, err)
	require.Equal(t, sum1[:], a.SHA256)
	require.Equal(t, "counters-"+hex.EncodeToString(sum1[:]), filepath.Base(a.Path))
	info, err := os.Stat(a.Path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o555), info.Mode().Perm())
	dir, err := os.Stat(filepath.Dir(a.Path))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o711), dir.Mode().Perm())

	// The deploy renames another build over the source: the copy stays
	// the verified bytes, and keeping the first version again (a restart
	// of an unchanged manifest) finds that copy, not the new file.
	v2 := []byte("#!/bin/sh\necho v2\n")
	tmp := src + ".new"
	require.NoError(t, os.WriteFile(tmp, v2, 0o755))
	require.NoError(t, os.Rename(tmp, src))
	got, err := os.ReadFile(a.Path)
	require.NoError(t, err)
	require.Equal(t, v1, got)
	again, err := k.keep(pluginhost.Config{Path: src, SHA256: sum1[:]})
	require.NoError(t, err)
	require.Equal(t, a.Path, again.Path)

	// Without a checksum (Config.Plugins) the bytes read are the version.
	sum2 := sha256.Sum256(v2)
	b, err := k.keep(pluginhost.Config{Path: src})
	require.NoError(t, err)
	require.Equal(t, sum2[:], b.SHA256)
	require.NotEqual(t, a.Path, b.Path)

	// Both versions referring to v1's copy give it back: it goes. Kept
	// again, v1 must come from src, which is not v1 any more: refused,
	// with both sums, and nothing kept.
	k.release(a.Path)
	require.FileExists(t, a.Path, "another version refers to it")
	k.release(again.Path)
	require.NoFileExists(t, a.Path, "no version refers to it")
	_, err = k.keep(pluginhost.Config{Path: src, SHA256: sum1[:]})
	require.ErrorContains(t, err, "binary "+src+" has SHA-256 "+hex.EncodeToString(sum2[:])+", but "+hex.EncodeToString(sum1[:])+" was expected")
	left, err := os.ReadDir(filepath.Dir(b.Path))
	require.NoError(t, err)
	require.Len(t, left, 1, "only v2's copy: a refused copy leaves nothing")

	k.release(b.Path)
	require.NoFileExists(t, b.Path)
	k.release(b.Path) // a path given back twice, or never kept, is ignored
	k.release("in-process:counters")
}
