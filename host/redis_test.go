package host_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// readmeACL returns the ACL SETUSER line docs/security.md shows, split
// into arguments.
func readmeACL(t *testing.T) []string {
	t.Helper()
	lines := doctest.Block(t, "docs/security.md", "## Redis ACL and TLS", "")
	require.Len(t, lines, 1, "docs/security.md shows one ACL SETUSER line")
	return strings.Fields(lines[0])
}

// A host whose Redis user has only the README's ACL line (under a name and
// password of the test's own) serves jobs end to end: relay, consumer,
// reclaim and the park script all run within it, on a stream of three
// shards (their keys are within the line's pattern too).
func TestHostRunsAsACLUser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	args := readmeACL(t)
	require.Equal(t, []string{"ACL", "SETUSER", "usher", "on", ">change-me"}, args[:5], "the README's user and password")
	user, pass := "usher_t_"+hosttest.Suffix(), hosttest.Suffix()
	cmd := []any{"ACL", "SETUSER", user, "on", ">" + pass}
	for _, a := range args[5:] {
		cmd = append(cmd, a)
	}
	require.NoError(t, b.rdb.Do(ctx, cmd...).Err())
	t.Cleanup(func() { _ = b.rdb.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	want := b.placeOrders(t, 30, 3)
	cfg := b.config()
	cfg.Redis = nil
	cfg.RedisURL = fmt.Sprintf("redis://%s:%s@%s/0", user, pass, b.rdb.Options().Addr)
	cfg.StreamShards = 3
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "2s", Once: true}) // reclaimed while it stalls)
	hosttest.Start(t, cfg)
	b.held(t, "counter.before_apply", jobID)
	b.waitDrained(t, 30)
	b.requireCounters(t, want)
	require.EqualValues(t, 30, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	// The park script (run only while a plugin is down) and what it calls
	// are allowed too.
	for _, c := range [][]any{
		{"EVALSHA", "0123456789012345678901234567890123456789", "1", b.stream, "usher", "c", "0-1", "1"},
		{"EVAL", "return 1", "1", b.stream, "usher", "c", "0-1", "1"},
		{"XPENDING", b.stream, "usher", "0-1", "0-1", "1"},
		{"XCLAIM", b.stream, "usher", "c", "0", "0-1", "RETRYCOUNT", "0", "JUSTID"},
	} {
		res, err := b.rdb.Do(ctx, append([]any{"ACL", "DRYRUN", user}, c...)...).Text()
		require.NoError(t, err)
		require.Equal(t, "OK", res, "%v", c)
	}
	// Nothing the host did was refused.
	log, err := b.rdb.Do(ctx, "ACL", "LOG", "128").Slice()
	require.NoError(t, err)
	for _, e := range log {
		require.NotContains(t, fmt.Sprint(e), user, "Redis refused the host a command")
	}
	// A key outside the pattern, or a command not in the list, is refused:
	// the user is confined.
	limited := redis.NewClient(&redis.Options{Addr: b.rdb.Options().Addr, Username: user, Password: pass})
	defer limited.Close()
	require.ErrorContains(t, limited.XAdd(ctx, &redis.XAddArgs{Stream: "other:" + hosttest.Suffix(), Values: []any{"a", "b"}}).Err(), "NOPERM")
	require.ErrorContains(t, limited.XGroupDestroy(ctx, b.stream, "usher").Err(), "NOPERM")
	require.ErrorContains(t, limited.Keys(ctx, "usher:*").Err(), "NOPERM")
}

// tlsRedis starts a redis-server of the test's own that speaks only TLS,
// with a certificate signed by a throwaway CA, and returns its address and
// the CA's PEM file.
func tlsRedis(t *testing.T) (addr, caFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "usher test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srvDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2),
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		ca, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	require.NoError(t, err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	caFile = write("ca.pem", "CERTIFICATE", caDER)
	certFile := write("server.pem", "CERTIFICATE", srvDER)
	keyFile := write("server.key", "EC PRIVATE KEY", keyDER)

	// A free port, never 6379; the server binds it right after.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	require.NotEqual(t, 6379, port)
	srv := exec.Command("redis-server", "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", dir)
	out, err := os.Create(filepath.Join(dir, "redis.log"))
	require.NoError(t, err)
	srv.Stdout, srv.Stderr = out, out
	require.NoError(t, srv.Start(), "redis-server must be on the PATH")
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		_ = out.Close()
	})
	addr = "127.0.0.1:" + strconv.Itoa(port)
	opt, err := host.RedisOptions("rediss://"+addr+"/0", caFile)
	require.NoError(t, err)
	probe := redis.NewClient(opt)
	defer probe.Close()
	hosttest.Eventually(t, 10*time.Second, "the TLS redis-server to answer", func() bool {
		return probe.Ping(context.Background()).Err() == nil
	})
	return addr, caFile
}

// A host talks to a TLS-only Redis through rediss:// with the test's CA as
// its only root, and serves jobs end to end. Without the CA it refuses the
// server's certificate; a CA file with a plain redis:// URL is refused.
func TestHostRunsOverTLS(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is needed to run a TLS Redis: %v", err)
	}
	b := setup(t)
	addr, caFile := tlsRedis(t)
	ctx := context.Background()

	cfg := b.config()
	cfg.Redis = nil
	cfg.RedisURL = "rediss://" + addr + "/0"
	cfg.Logger = hosttest.Logger(t, 0)
	_, err := host.New(ctx, cfg)
	require.ErrorContains(t, err, "certificate signed by unknown authority", "the system's roots do not know the test CA")
	cfg.RedisURL, cfg.RedisCAFile = "redis://"+addr+"/0", caFile
	_, err = host.New(ctx, cfg)
	require.ErrorContains(t, err, "is not rediss://")

	want := b.placeOrders(t, 20, 2)
	cfg.RedisURL = "rediss://" + addr + "/0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 60*time.Second, "20 jobs applied over TLS and nothing pending", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == 20 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome IS NULL`) == 0 &&
			hosttest.Pending(t, h.Redis(), b.stream, "usher") == 0
	})
	b.requireCounters(t, want)
	require.EqualValues(t, 20, h.Redis().XInfoStream(ctx, b.stream).Val().EntriesAdded, "the entries went to the TLS server")
	require.Zero(t, b.rdb.Exists(ctx, b.stream).Val(), "and not to the plain one")
}
