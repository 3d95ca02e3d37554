package host

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/usherhq/usher/host/pluginhost"
)

// keepBinary copies the binary of a version about to be swapped out into a
// directory of the host's own and returns the config that starts the copy,
// checked against the same SHA-256: a deploy replaces the plugin
// directory's file (make plugins rebuilds it under the same name), and a
// rollback must still find the bytes that ran. The copy is read from the
// running process's executable (/proc/PID/exe, the bytes that ran even
// when the file was renamed over), else from its path; a copy that does
// not match the version's checksum is not kept, and the rollback then
// starts the path as it is (refused if its checksum no longer matches).
func (h *Host) keepBinary(pcfg pluginhost.Config, pid int) pluginhost.Config {
	h.keepMu.Lock()
	defer h.keepMu.Unlock()
	if h.keepDir == "" {
		dir, err := os.MkdirTemp("", "usher-plugins-*")
		if err == nil {
			// The plugins may run as another user (PluginUser): they
			// must reach the files, not list them.
			err = os.Chmod(dir, 0o711)
		}
		if err != nil {
			h.log.Warn("cannot keep the binaries of swapped-out versions; a rollback starts them from the plugin directory", "err", err)
			return pcfg
		}
		h.keepDir = dir
	}
	h.keepSeq++
	dst := filepath.Join(h.keepDir, filepath.Base(pcfg.Path)+"."+strconv.Itoa(h.keepSeq))
	var err error
	for _, src := range []string{fmt.Sprintf("/proc/%d/exe", pid), pcfg.Path} {
		if err = copyVerified(src, dst, pcfg.SHA256); err == nil {
			kept := pcfg
			kept.Path = dst
			return kept
		}
	}
	h.log.Warn("could not keep the binary of the version swapped out; a rollback starts it from its path", "path", pcfg.Path, "err", err)
	return pcfg
}

// copyVerified copies src to dst, executable, and removes it unless its
// SHA-256 is sum (any, when sum is empty).
func copyVerified(src, dst string, sum []byte) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	hash := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, hash), in); err != nil {
		return err
	}
	if got := hash.Sum(nil); len(sum) > 0 && !bytes.Equal(got, sum) {
		return fmt.Errorf("%s has SHA-256 %x, not the version's %x", src, got, sum)
	}
	return nil
}

// dropKept removes a kept binary no version refers to any more.
func (h *Host) dropKept(path string) {
	h.keepMu.Lock()
	defer h.keepMu.Unlock()
	if h.keepDir != "" && filepath.Dir(path) == h.keepDir {
		_ = os.Remove(path)
	}
}
