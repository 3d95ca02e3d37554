// Package secretfile reads the files that hold the host's secrets (the
// admin token, the stream signing key, a Redis password) and checks the
// ones other code reads (libpq's passfile): a secret file group or others
// may read or write is refused, never used. A plugin runs as another OS
// user than the host, so a file only its owner can read is out of its
// reach; one that is 0644 is not.
package secretfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// MaxSize is the most Read reads of a file.
const MaxSize = 64 << 10

// Read returns the content of the secret file path. It refuses a file that
// is not a regular file, or that group or others may read or write (mode &
// 0077), with an error naming it as what ("admin token file") and saying
// how to fix it, and reads at most MaxSize bytes. A missing file is an
// error matching fs.ErrNotExist.
func Read(what, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	// Checked on the open file, so the mode and the content are the same
	// file's.
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := check(what, path, st); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return b, nil
}

// Check refuses the secret file path as Read does, without reading it: for
// a file another library reads (libpq's passfile, read by pgx).
func Check(what, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return check(what, path, st)
}

func check(what, path string, st os.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s %s is not a regular file", what, path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s %s has mode %04o: group or others may read it; refusing it (chmod 600 %s, or create it so: (umask 077; ... > %s))",
			what, path, perm, path, filepath.Base(path))
	}
	return nil
}
