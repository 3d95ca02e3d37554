package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// ErrNotFound is returned (wrapped, with the key) by [FS.Get] when no blob is
// stored under the key. Test for it with errors.Is.
var ErrNotFound = errors.New("blob: not found")

// Permissions of the files and directories the store creates. Rendered
// tickets carry buyers' names and e-mail addresses, so they are not
// world-readable.
const (
	fileMode os.FileMode = 0o640
	dirMode  os.FileMode = 0o750
)

// maxKeyLen bounds key length, well below common PATH_MAX limits.
const maxKeyLen = 1024

// FS is a blob store that keeps each blob in a file below Root, at the
// key's path. It is safe for concurrent use by multiple goroutines and by
// multiple processes sharing the same Root.
type FS struct {
	// Root is the directory that holds the blobs. NewFS makes it absolute.
	Root string
}

// NewFS returns a store rooted at root, creating the directory (and any
// missing parents) if needed.
func NewFS(root string) (*FS, error) {
	if root == "" {
		return nil, errors.New("blob: empty root directory")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("blob: root %s: %w", root, err)
	}
	if err := os.MkdirAll(abs, dirMode); err != nil {
		return nil, fmt.Errorf("blob: create root: %w", err)
	}
	return &FS{Root: abs}, nil
}

// Put stores data under key, replacing any previous blob with that key.
//
// A key is a relative, slash-separated path made of the characters
// [A-Za-z0-9._/-], such as "tickets/SD-4471.pdf". It must be clean (no
// empty, "." or ".." segments, no leading or trailing slash), must not
// contain "..", and no segment may start with "." (such names are reserved
// for temporary files). Put, Get and Exists reject other keys with an error
// that names the key.
//
// The write is atomic: data goes to a temporary file in the key's directory,
// which is fsynced and then renamed over the final name, after which the
// directory itself is fsynced. Readers never see a partial file, and of
// several concurrent Puts of one key exactly one wins in full.
//
// A second Put of the same bytes under the same key leaves the store as
// the first left it, so a handler may call Put from Prepare with a key
// derived from the job (usher-vet reads the directive below).
//
//usher:idempotent-by-key
func (s *FS) Put(ctx context.Context, key string, data []byte) error {
	final, err := s.path(ctx, key)
	if err != nil {
		return err
	}
	dir := filepath.Dir(final)
	if err := s.mkdirAll(dir); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	if err := writeAtomic(dir, final, data); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	return nil
}

// writeAtomic writes data to a temporary file in dir and renames it to
// final, syncing the file and then dir.
func writeAtomic(dir, final string, data []byte) error {
	tmp, err := os.CreateTemp(dir, ".tmp-*") // dot: hidden from List
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = tmp.Close() // may already be closed; the error is irrelevant
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Chmod(fileMode); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return err
	}
	renamed = true
	return syncDir(dir)
}

// Get returns the blob stored under key. If there is none, the error wraps
// ErrNotFound and names the key.
func (s *FS) Get(ctx context.Context, key string) ([]byte, error) {
	p, err := s.path(ctx, key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		if notExist(err) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, fmt.Errorf("blob: get %s: %w", key, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("blob: get %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() { // e.g. the key names a directory of blobs
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	var buf bytes.Buffer
	buf.Grow(int(fi.Size()) + bytes.MinRead)
	if _, err := buf.ReadFrom(f); err != nil {
		return nil, fmt.Errorf("blob: get %s: %w", key, err)
	}
	return buf.Bytes(), nil
}

// Exists reports whether a blob is stored under key.
func (s *FS) Exists(ctx context.Context, key string) (bool, error) {
	p, err := s.path(ctx, key)
	if err != nil {
		return false, err
	}
	fi, err := os.Stat(p)
	switch {
	case err == nil:
		return fi.Mode().IsRegular(), nil
	case notExist(err):
		return false, nil
	default:
		return false, fmt.Errorf("blob: exists %s: %w", key, err)
	}
}

// List returns the keys of all blobs whose key starts with prefix, sorted
// in byte order; an empty prefix lists every blob. The match is on the
// string, not on whole segments: "tickets/SD-44" matches
// "tickets/SD-4471.pdf". The result is empty (nil) when nothing matches.
// A prefix must use the key alphabet, must not start with "/" or contain
// "..", and its directory part must be a valid key.
func (s *FS) List(ctx context.Context, prefix string) ([]string, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	if err := validatePrefix(prefix); err != nil {
		return nil, err
	}
	start := s.Root
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = filepath.Join(s.Root, filepath.FromSlash(prefix[:i]))
	}
	var keys []string
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && notExist(err) {
				return fs.SkipAll // nothing stored under that directory
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p != start && strings.HasPrefix(d.Name(), ".") { // temporary files
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(s.Root, p)
		if err != nil {
			return err
		}
		if key := filepath.ToSlash(rel); strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("blob: list %q: %w", prefix, err)
	}
	slices.Sort(keys) // WalkDir order differs from byte order ("a-b" < "a/b")
	return keys, nil
}

// ready checks that s is usable and ctx is live.
func (s *FS) ready(ctx context.Context) error {
	if s == nil || s.Root == "" {
		return errors.New("blob: FS has no root; use NewFS")
	}
	return ctx.Err()
}

// path validates key and returns its file path.
func (s *FS) path(ctx context.Context, key string) (string, error) {
	if err := s.ready(ctx); err != nil {
		return "", err
	}
	if err := validateKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.Root, filepath.FromSlash(key)), nil
}

// mkdirAll creates dir, which lies inside s.Root, and any missing parents,
// fsyncing the parent of every directory it creates so the new entries are
// durable before a blob is renamed into them.
func (s *FS) mkdirAll(dir string) error {
	rel, err := filepath.Rel(s.Root, dir)
	if err != nil {
		return err
	}
	if rel == "." {
		return nil
	}
	cur := s.Root
	for _, seg := range strings.Split(rel, string(filepath.Separator)) {
		parent := cur
		cur = filepath.Join(cur, seg)
		err := os.Mkdir(cur, dirMode)
		switch {
		case err == nil:
			if err := syncDir(parent); err != nil {
				return err
			}
		case errors.Is(err, fs.ErrExist):
			fi, err := os.Stat(cur)
			if err != nil {
				return err
			}
			if !fi.IsDir() {
				return fmt.Errorf("%s is a blob, not a directory", filepath.ToSlash(mustRel(s.Root, cur)))
			}
		default:
			return err
		}
	}
	return nil
}

// mustRel is filepath.Rel for paths known to lie below base.
func mustRel(base, p string) string {
	rel, err := filepath.Rel(base, p)
	if err != nil {
		return p
	}
	return rel
}

// syncDir fsyncs a directory so that entries created or renamed in it
// survive a crash. Windows cannot fsync directories; there it is a no-op.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}

// notExist reports whether err means that a path does not exist, including
// the case where one of its parents is a file.
func notExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// validateKey enforces the key rules documented on FS.Put.
func validateKey(key string) error {
	if problem := keyProblem(key); problem != "" {
		return fmt.Errorf("blob: invalid key %q: %s", key, problem)
	}
	return nil
}

// validatePrefix checks a List prefix: the part up to its last slash must
// be a valid key, and the rest must use the key alphabet and not contain
// "..".
func validatePrefix(prefix string) error {
	var problem string
	switch i := strings.LastIndexByte(prefix, '/'); {
	case len(prefix) > maxKeyLen:
		problem = fmt.Sprintf("longer than %d bytes", maxKeyLen)
	case i == 0:
		problem = "absolute path"
	case i > 0:
		if problem = keyProblem(prefix[:i]); problem == "" {
			problem = charProblem(prefix[i+1:])
		}
	default:
		problem = charProblem(prefix)
	}
	if problem != "" {
		return fmt.Errorf("blob: invalid prefix %q: %s", prefix, problem)
	}
	return nil
}

// keyProblem describes what is wrong with key, or returns "" if it is valid.
func keyProblem(key string) string {
	switch {
	case key == "":
		return "empty"
	case len(key) > maxKeyLen:
		return fmt.Sprintf("longer than %d bytes", maxKeyLen)
	case key[0] == '/':
		return "absolute path"
	}
	if p := charProblem(key); p != "" {
		return p
	}
	for _, seg := range strings.Split(key, "/") {
		switch {
		case seg == "":
			return "empty path segment"
		case seg[0] == '.':
			return fmt.Sprintf("segment %q starts with a dot", seg)
		case len(seg) > 255:
			return "segment longer than 255 bytes"
		}
	}
	return ""
}

// charProblem reports a character outside [A-Za-z0-9._/-] or a ".." in s.
func charProblem(s string) string {
	if strings.Contains(s, "..") {
		return `contains ".."`
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '_' || c == '/' || c == '-') {
			return fmt.Sprintf("character %q not allowed (use A-Z a-z 0-9 . _ / -)", c)
		}
	}
	return ""
}
