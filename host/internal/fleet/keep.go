package fleet

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/usherhq/usher/host/pluginhost"
)

// The host starts only binaries it verified and kept itself. A deploy
// replaces the plugin directory's files (renamed over, or under a new
// name), and a plugin may crash at any moment of it: a restart, a swap's
// start or a rollback must never run whatever the directory holds then.
// So every version's binary is copied, at its load or swap, into a
// directory of the host's own, under its SHA-256 (content-addressed),
// verified against the manifest's checksum (or, for a binary without a
// manifest, against the sum of the bytes read at load), and only that copy
// is started: the supervisor restarts it, a rollback starts the previous
// version's copy. The copy's Config carries the sum, so go-plugin checks it
// again before every start. A copy is removed once no version (running,
// or kept for a rollback) refers to it, and the directory by Close.
//
// In-process plugins (LoadInProcess) have no binary: nothing is kept.

// keeper is the fleet's directory of kept binaries and the versions
// referring to each copy.
type keeper struct {
	mu sync.Mutex
	// dir is made at the first keep: 0o711, so that plugins running as
	// other OS users (PluginUser) can execute a copy but not list them.
	dir string
	// refs counts, per kept copy, the versions referring to it (a plugin's
	// running version and the one kept for its rollback may be one copy).
	refs map[string]int
}

// keep copies the binary pcfg starts into the keep directory, checked
// against pcfg.SHA256 when set, and returns the Config that starts the
// copy, with the copy's SHA-256. The caller owns one reference to the copy
// and gives it back with release. A binary that does not match its
// checksum is refused, with both sums, and nothing is kept.
func (k *keeper) keep(pcfg pluginhost.Config) (pluginhost.Config, error) {
	if pcfg.InProcess != nil {
		return pcfg, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dir == "" {
		dir, err := os.MkdirTemp("", "usher-plugins-*")
		if err == nil {
			err = os.Chmod(dir, 0o711)
		}
		if err != nil {
			return pluginhost.Config{}, fmt.Errorf("keep the plugin binaries: %w", err)
		}
		k.dir, k.refs = dir, map[string]int{}
	}
	var dst string
	var sum []byte
	if len(pcfg.SHA256) > 0 {
		// The same bytes kept already (a restart of an unchanged
		// manifest, two versions of one build): that copy, if it still
		// is what it was.
		p := k.path(pcfg.SHA256, pcfg.Path)
		if got, err := pluginhost.FileSHA256(p); err == nil && got == hex.EncodeToString(pcfg.SHA256) {
			dst, sum = p, pcfg.SHA256
		}
	}
	if dst == "" {
		var err error
		if dst, sum, err = k.copy(pcfg.Path, pcfg.SHA256); err != nil {
			return pluginhost.Config{}, err
		}
	}
	k.refs[dst]++
	kept := pcfg
	kept.Path, kept.SHA256 = dst, sum
	if kept.Name == "" {
		// A binary with no manifest is named by its file (its OS user
		// with --plugin-user usher-p-{name}), not by its copy's.
		kept.User = pluginhost.UserFor(pcfg.User, filepath.Base(pcfg.Path))
	}
	return kept, nil
}

// path is where the bytes with SHA-256 sum, copied from src, are kept:
// the source's name first, for whoever reads a process list (ps shows the
// first 15 bytes), then the sum.
func (k *keeper) path(sum []byte, src string) string {
	return filepath.Join(k.dir, filepath.Base(src)+"-"+hex.EncodeToString(sum))
}

// copy copies src into the keep directory under its SHA-256 and returns
// the copy's path and sum; the caller holds mu. The bytes are hashed as
// they are copied, so the copy is what was verified even if src changes
// meanwhile; it is written under a temporary name and renamed, read-only
// and executable by anyone.
func (k *keeper) copy(src string, want []byte) (string, []byte, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", nil, fmt.Errorf("keep the plugin binary: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(k.dir, ".copy-*")
	if err != nil {
		return "", nil, fmt.Errorf("keep the plugin binary: %w", err)
	}
	defer os.Remove(tmp.Name()) // once renamed, a no-op
	hash := sha256.New()
	_, err = io.Copy(io.MultiWriter(tmp, hash), in)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", nil, fmt.Errorf("keep the plugin binary %s: %w", src, err)
	}
	got := hash.Sum(nil)
	if len(want) > 0 && !bytes.Equal(got, want) {
		return "", nil, fmt.Errorf("binary %s has SHA-256 %x, but %x was expected; refusing to start it", src, got, want)
	}
	dst := k.path(got, src)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", nil, fmt.Errorf("keep the plugin binary %s: %w", src, err)
	}
	return dst, got, nil
}

// release gives back one reference to the kept copy path (a Config
// keep returned); the last one removes the copy. Any other path (an
// in-process plugin's) is left alone.
func (k *keeper) release(path string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	n, ok := k.refs[path]
	switch {
	case !ok:
		return
	case n > 1:
		k.refs[path] = n - 1
		return
	}
	delete(k.refs, path)
	_ = os.Remove(path)
}

// removeAll removes the keep directory and every copy in it.
func (k *keeper) removeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dir != "" {
		_ = os.RemoveAll(k.dir)
		k.dir, k.refs = "", nil
	}
}
