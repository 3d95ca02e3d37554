package secretfile_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/secretfile"
)

func TestReadRefusesWhatOthersCanRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "signing.key")
	require.NoError(t, os.WriteFile(path, []byte("secret"), 0o600))
	b, err := secretfile.Read("signing key file", path)
	require.NoError(t, err)
	require.Equal(t, "secret", string(b))
	require.NoError(t, secretfile.Check("signing key file", path))

	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620, 0o660} {
		require.NoError(t, os.Chmod(path, mode))
		_, err := secretfile.Read("signing key file", path)
		require.ErrorContains(t, err, "group or others may read it; refusing it (chmod 600 "+path, "%04o", mode)
		require.Error(t, secretfile.Check("signing key file", path), "%04o", mode)
	}
	_, err = secretfile.Read("passfile", dir)
	require.ErrorContains(t, err, "is not a regular file")
	_, err = secretfile.Read("passfile", filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}
