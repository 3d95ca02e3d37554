package admin

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/usherhq/usher/host/secretfile"
)

// MinTokenLen is the shortest token accepted, in characters. A generated
// token is 64 (32 random bytes, hex).
const MinTokenLen = 16

// DefaultTokenFile is where the host keeps its admin token unless told
// otherwise, and where `host plugins` looks for it:
// $XDG_STATE_HOME/usher/admin-token, or ~/.local/state/usher/admin-token
// when XDG_STATE_HOME is unset. The XDG state directory is the place for
// data a program creates and keeps between runs that is not configuration
// and not a cache; it is per user, so a host and the operator's CLI running
// as the same user find the same file with no flag, and another user's
// processes do not (the file is 0600). A service running as its own user
// should be given an explicit path (--admin-token-file) that its operators
// can read.
func DefaultTokenFile() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "usher", "admin-token"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no default admin token file (set XDG_STATE_HOME or HOME, or give the file): %w", err)
	}
	return filepath.Join(home, ".local", "state", "usher", "admin-token"), nil
}

// ReadTokenFile reads the token from path. It refuses a file that group or
// others may read or write (the token is the admin API's only credential),
// an empty one, and a token shorter than MinTokenLen. Surrounding
// whitespace (a trailing newline) is ignored. A missing file is an error
// matching fs.ErrNotExist.
func ReadTokenFile(path string) (string, error) {
	b, err := secretfile.Read("admin token file", path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if err := CheckToken(tok); err != nil {
		return "", fmt.Errorf("admin token file %s: %w", path, err)
	}
	return tok, nil
}

// CheckToken refuses an empty token, one shorter than MinTokenLen, and one
// with characters that cannot travel in an HTTP header.
func CheckToken(tok string) error {
	if len(tok) < MinTokenLen {
		return fmt.Errorf("the admin token has %d characters, fewer than %d", len(tok), MinTokenLen)
	}
	for _, c := range []byte(tok) {
		if c <= ' ' || c >= 0x7f {
			return errors.New("the admin token may hold only printable ASCII without spaces")
		}
	}
	return nil
}

// LoadOrCreateTokenFile returns the token in path, creating the file with a
// new token (32 random bytes, hex) when it does not exist. The directory is
// created 0700 and the file 0600. The file is written atomically and
// exclusively: the token goes to a temporary file that is then hard-linked
// to path, which fails if path exists, so a reader never sees a partial
// token and, when several hosts start at once on the same file, one token
// wins and the others read it. created reports whether this call wrote it.
func LoadOrCreateTokenFile(path string) (tok string, created bool, err error) {
	tok, err = ReadTokenFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return tok, false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	tok = hex.EncodeToString(b)
	tmp, err := os.CreateTemp(dir, ".admin-token-*")
	if err != nil {
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600; Chmod says so whatever the umask.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	if _, err := tmp.WriteString(tok + "\n"); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			// Another host created it first: use its token.
			tok, err = ReadTokenFile(path)
			return tok, false, err
		}
		return "", false, fmt.Errorf("admin token file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return tok, true, nil
}
