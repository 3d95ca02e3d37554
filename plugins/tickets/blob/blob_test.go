package blob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/plugins/tickets/blob"
)

func newFS(t *testing.T) *blob.FS {
	t.Helper()
	s, err := blob.NewFS(filepath.Join(t.TempDir(), "nested", "root"))
	require.NoError(t, err)
	return s
}

// files returns every file and directory below root as slash paths.
func files(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, filepath.ToSlash(rel))
		return err
	}))
	return out
}

func TestNewFS(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	require.True(t, filepath.IsAbs(s.Root))
	fi, err := os.Stat(s.Root)
	require.NoError(t, err)
	require.True(t, fi.IsDir())

	_, err = blob.NewFS("")
	require.Error(t, err)

	// The zero FS is rejected rather than writing relative to the cwd.
	err = (&blob.FS{}).Put(context.Background(), "a", nil)
	require.ErrorContains(t, err, "no root")
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFS(t)
	const key = "tickets/SD-4471.pdf"

	ok, err := s.Exists(ctx, key)
	require.NoError(t, err)
	require.False(t, ok)
	_, err = s.Get(ctx, key)
	require.ErrorIs(t, err, blob.ErrNotFound)
	require.ErrorContains(t, err, key)

	data := []byte("%PDF-1.3 fake ticket")
	require.NoError(t, s.Put(ctx, key, data))
	require.NoError(t, s.Put(ctx, key, data)) // identical second Put is harmless
	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, data, got)
	ok, err = s.Exists(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)

	// The blob is a plain file at the key's path, not world-readable.
	fi, err := os.Stat(filepath.Join(s.Root, "tickets", "SD-4471.pdf"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), fi.Mode().Perm())

	// Overwrite, and empty blobs.
	require.NoError(t, s.Put(ctx, key, []byte("v2")))
	got, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "v2", string(got))
	require.NoError(t, s.Put(ctx, "empty", nil))
	got, err = s.Get(ctx, "empty")
	require.NoError(t, err)
	require.Empty(t, got)

	require.Equal(t, []string{"empty", "tickets/", "tickets/SD-4471.pdf"}, files(t, s.Root))
}

func TestNotFoundShapes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFS(t)
	require.NoError(t, s.Put(ctx, "a/b.pdf", []byte("x")))

	// A directory of blobs, and a path through a blob, are not blobs.
	for _, key := range []string{"a", "a/b.pdf/c", "missing/x.pdf"} {
		_, err := s.Get(ctx, key)
		require.ErrorIs(t, err, blob.ErrNotFound, key)
		ok, err := s.Exists(ctx, key)
		require.NoError(t, err, key)
		require.False(t, ok, key)
	}

	// A key cannot turn an existing blob into a directory.
	err := s.Put(ctx, "a/b.pdf/c", []byte("y"))
	require.ErrorContains(t, err, "a/b.pdf/c")
	require.ErrorContains(t, err, "not a directory")
}

func TestBadKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFS(t)
	bad := []string{
		"",
		"/etc/passwd",
		"../escape.pdf",
		"tickets/../../escape.pdf",
		"tickets/..",
		"tickets/SD..pdf",
		"tickets//SD-1.pdf",
		"tickets/",
		"./tickets/SD-1.pdf",
		"tickets/./SD-1.pdf",
		".",
		".hidden",
		"tickets/.tmp-123",
		"tickets/SD 1.pdf",
		`tickets\SD-1.pdf`,
		"tickets/SD-1.pdf\x00",
		"tickets/Zoë.pdf",
		"C:/x.pdf",
		"tickets/" + strings.Repeat("a", 256),
		strings.Repeat("a/", 600) + "a",
	}
	for _, key := range bad {
		errs := map[string]error{"Put": s.Put(ctx, key, []byte("x"))}
		_, errs["Get"] = s.Get(ctx, key)
		_, errs["Exists"] = s.Exists(ctx, key)
		for op, err := range errs {
			require.Error(t, err, "%s(%q)", op, key)
			require.ErrorContains(t, err, strconv.Quote(key), "%s(%q)", op, key)
			require.NotErrorIs(t, err, blob.ErrNotFound, "%s(%q)", op, key)
		}
	}
	require.Empty(t, files(t, s.Root), "rejected keys must not create anything")

	good := []string{"a", "tickets/SD-4471.pdf", "A_b-c.d/e.f/g", "x.y.z", strings.Repeat("a", 255)}
	for _, key := range good {
		require.NoError(t, s.Put(ctx, key, []byte(key)), key)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFS(t)

	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Empty(t, keys)

	for _, key := range []string{
		"tickets/SD-4471.pdf", "tickets/SD-4472.pdf", "tickets/SD-5000.pdf",
		"tickets/2026/SD-1.pdf", "tickets-old/SD-1.pdf", "receipts/SD-4471.pdf", "top.pdf",
	} {
		require.NoError(t, s.Put(ctx, key, []byte(key)))
	}
	// Leftovers that are not blobs: a crashed writer's temp file, a hidden
	// directory and an empty directory.
	require.NoError(t, os.WriteFile(filepath.Join(s.Root, "tickets", ".tmp-999"), []byte("junk"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Root, ".trash", "x"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(s.Root, ".trash", "x", "y.pdf"), nil, 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Root, "tickets", "empty"), 0o750))

	cases := map[string][]string{
		"": {
			"receipts/SD-4471.pdf", "tickets-old/SD-1.pdf", "tickets/2026/SD-1.pdf",
			"tickets/SD-4471.pdf", "tickets/SD-4472.pdf", "tickets/SD-5000.pdf", "top.pdf",
		},
		"tickets/":         {"tickets/2026/SD-1.pdf", "tickets/SD-4471.pdf", "tickets/SD-4472.pdf", "tickets/SD-5000.pdf"},
		"tickets":          {"tickets-old/SD-1.pdf", "tickets/2026/SD-1.pdf", "tickets/SD-4471.pdf", "tickets/SD-4472.pdf", "tickets/SD-5000.pdf"},
		"tickets/SD-44":    {"tickets/SD-4471.pdf", "tickets/SD-4472.pdf"},
		"tickets/2026":     {"tickets/2026/SD-1.pdf"},
		"t":                {"tickets-old/SD-1.pdf", "tickets/2026/SD-1.pdf", "tickets/SD-4471.pdf", "tickets/SD-4472.pdf", "tickets/SD-5000.pdf", "top.pdf"},
		"top.pdf":          {"top.pdf"},
		"nope/":            nil,
		"nope/deeper/x":    nil,
		"top.pdf/x":        nil,
		"tickets/.tmp":     nil,
		"tickets/empty/":   nil,
		"receipts/SD-4471": {"receipts/SD-4471.pdf"},
	}
	for prefix, want := range cases {
		got, err := s.List(ctx, prefix)
		require.NoError(t, err, "List(%q)", prefix)
		require.Equal(t, want, got, "List(%q)", prefix)
	}

	for _, prefix := range []string{"/", "/tickets", "../", "tickets/../", "tickets//", "a b", ".trash/", "tickets/SD..", "ü"} {
		_, err := s.List(ctx, prefix)
		require.ErrorContains(t, err, strconv.Quote(prefix), "List(%q)", prefix)
	}
}

func TestContextCanceled(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Put(ctx, "a.pdf", []byte("x")), context.Canceled)
	_, err := s.Get(ctx, "a.pdf")
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.Exists(ctx, "a.pdf")
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.List(ctx, "")
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, files(t, s.Root))
}

// TestConcurrentPutSameBytes is the re-render race: many requests render
// the same ticket PDF and store it at once.
func TestConcurrentPutSameBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFS(t)
	const key = "tickets/SD-4471.pdf"
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB

	start := make(chan struct{})
	errs := make(chan error, 20)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			<-start
			errs <- s.Put(ctx, key, data)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	require.Equal(t, []string{"tickets/", "tickets/SD-4471.pdf"}, files(t, s.Root), "temp files left behind")
}

// TestConcurrentPutNeverTorn races writers of different contents against
// readers: every read and the final state must be one writer's full blob.
func TestConcurrentPutNeverTorn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFS(t)
	const key = "tickets/SD-1.pdf"
	const writers = 20
	blobs := make(map[string]bool, writers)
	payload := func(i int) []byte { return bytes.Repeat([]byte{byte('A' + i)}, 256<<10) }
	for i := range writers {
		blobs[string(payload(i))] = true
	}
	require.NoError(t, s.Put(ctx, key, payload(0)))

	start := make(chan struct{})
	var writersWG, readersWG sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, writers+4)
	report := func(err error) { // keep the first few; never block
		select {
		case errs <- err:
		default:
		}
	}
	for i := range writers {
		writersWG.Go(func() {
			<-start
			for range 5 {
				if err := s.Put(ctx, key, payload(i)); err != nil {
					report(err)
					return
				}
			}
		})
	}
	for range 4 {
		readersWG.Go(func() {
			<-start
			for {
				select {
				case <-done:
					return
				default:
				}
				got, err := s.Get(ctx, key)
				if err == nil && !blobs[string(got)] {
					err = fmt.Errorf("torn read: %d bytes starting %q", len(got), got[:min(len(got), 8)])
				}
				if err != nil {
					report(err)
					return
				}
			}
		})
	}
	close(start)
	writersWG.Wait()
	close(done)
	readersWG.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, blobs[string(got)])
	require.Equal(t, []string{"tickets/", "tickets/SD-1.pdf"}, files(t, s.Root))
}

// TestConcurrentPutProcesses runs writers in child processes sharing one
// root, since atomicity must also hold across processes.
func TestConcurrentPutProcesses(t *testing.T) {
	const key = "tickets/SD-2.pdf"
	payload := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 128<<10) }
	if root := os.Getenv("BLOB_TEST_ROOT"); root != "" {
		i, err := strconv.Atoi(os.Getenv("BLOB_TEST_WRITER"))
		require.NoError(t, err)
		s, err := blob.NewFS(root)
		require.NoError(t, err)
		for range 25 {
			require.NoError(t, s.Put(context.Background(), key, payload(i)))
		}
		return
	}
	t.Parallel()
	s := newFS(t)
	const procs = 4
	cmds := make([]*exec.Cmd, procs)
	outs := make([]bytes.Buffer, procs)
	for i := range procs {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestConcurrentPutProcesses$", "-test.count=1")
		cmds[i].Env = append(os.Environ(), "BLOB_TEST_ROOT="+s.Root, "BLOB_TEST_WRITER="+strconv.Itoa(i))
		cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
		require.NoError(t, cmds[i].Start())
	}
	for i, cmd := range cmds {
		require.NoError(t, cmd.Wait(), "writer %d: %s", i, outs[i].String())
	}

	got, err := s.Get(context.Background(), key)
	require.NoError(t, err)
	ok := false
	for i := range procs {
		ok = ok || bytes.Equal(got, payload(i))
	}
	require.True(t, ok, "final blob is not any single writer's content")
	require.Equal(t, []string{"tickets/", "tickets/SD-2.pdf"}, files(t, s.Root))
}

func TestErrNotFoundIsSentinel(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	_, err := s.Get(context.Background(), "x/y.pdf")
	require.True(t, errors.Is(err, blob.ErrNotFound))
	require.Equal(t, "blob: not found: x/y.pdf", err.Error())
}
