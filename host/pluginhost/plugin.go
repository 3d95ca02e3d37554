// Package pluginhost starts handler plugins as separate processes with
// hashicorp/go-plugin over gRPC, reads and checks their manifests, serves
// them the host's callback service through go-plugin's broker, and keeps
// them running.
//
//   - Start: the handshake (AutoMTLS, every protocol version the host
//     speaks, see Protocols), the SHA-256 check before the process starts,
//     a health check, the plugin's manifest (a guard for every kind; the
//     name and version asked for).
//   - Supervisor: restarts with backoff, marks a crash loop unhealthy, and
//     swaps versions (start, check, route, drain, stop).
//   - FileManifest, ScanDir, Watcher: a plugin directory of binaries and
//     the manifest files that name them, and the watch that notices a
//     change. Deciding what to load or swap is the host's.
package pluginhost

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Manifest is what a plugin reports about itself.
type Manifest struct {
	Name    string
	Version string
	// ProtocolVersion is the protocol the plugin reports it was built
	// for; Protocol is the one the handshake negotiated and the host
	// speaks with it.
	ProtocolVersion int
	Protocol        int
	Kinds           []KindInfo
}

// KindInfo is one kind a plugin serves, with its guard.
type KindInfo struct {
	Kind          string
	Guard         usherv1.Guard
	SchemaVersion int
}

// clientShim is the host side of the go-plugin contract: a Plugin client
// plus the broker id of the callback server it serves to the plugin.
type clientShim struct {
	rpc      usherv1.PluginClient
	brokerID uint32
}

// grpcPlugin is the go-plugin GRPCPlugin on the host side.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	host usherv1.HostServer
	// serving counts the callback servers still running: Kill closes
	// their brokers and waits for them, so no goroutine of an instance
	// (nor a callback it was answering) outlives its Kill.
	serving sync.WaitGroup
	mu      sync.Mutex
	brokers []*plugin.GRPCBroker
}

func (p *grpcPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error {
	return errors.New("pluginhost: the host does not serve plugins")
}

// GRPCClient starts ONE callback server on the broker for this plugin
// instance. go-plugin's broker opens a listener per AcceptAndServe, so a
// server per call would leak listeners and cost a handshake per job.
func (p *grpcPlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	id := broker.NextId()
	p.mu.Lock()
	p.brokers = append(p.brokers, broker)
	p.mu.Unlock()
	p.serving.Go(func() {
		broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
			s := grpc.NewServer(append(opts,
				grpc.MaxRecvMsgSize(contract.MaxMessageBytes),
				grpc.MaxSendMsgSize(contract.MaxMessageBytes))...)
			usherv1.RegisterHostServer(s, p.host)
			return s
		})
	})
	return &clientShim{rpc: usherv1.NewPluginClient(conn), brokerID: id}, nil
}

var _ plugin.GRPCPlugin = (*grpcPlugin)(nil)

// Config describes one plugin binary to start.
type Config struct {
	// Path of the plugin binary. Required.
	Path string
	// Host serves the plugin's callbacks. Required.
	Host usherv1.HostServer
	// SHA256, when set, is the binary's expected checksum; go-plugin
	// verifies it before starting the process, and a mismatch is refused
	// with both sums.
	SHA256 []byte
	// Name and Version, when set, are what the running plugin must report
	// (a manifest file's); a plugin reporting another name or version is
	// stopped and refused.
	Name, Version string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Stderr, when set, also receives the plugin's raw stderr.
	Stderr io.Writer
	// Env is the plugin's environment besides the few variables it
	// inherits from the host (Environ): nothing else of the host's
	// environment (its database URL, tokens, passfile) reaches a plugin.
	Env []string
	// User, when set, is the OS user the plugin process runs as (the host
	// must be root to switch): a plugin then cannot read the host's
	// files, its passfile, token or signing key. NamePlaceholder in it
	// stands for the plugin's name (Name, else the binary's file name):
	// with DefaultUserPattern each plugin has a user of its own and cannot
	// signal, ptrace or read another's /proc either. Never root. Default:
	// the host's user.
	User string
	// Dir is the plugin process's working directory. Default: the host's.
	Dir string
	// InProcess, when set, serves the plugin it returns inside the host's
	// own process instead of starting Path: no process, no gRPC, no
	// broker. Its statements still run through Host on the plugin's own
	// database role, but nothing else separates it from the host. For
	// measuring what the plugin boundary costs, never for untrusted code.
	InProcess func(host usherv1.HostClient) usherv1.PluginServer
}

// inherited are the variables of the host's environment a plugin gets: what
// a process needs to run, none of the host's configuration or secrets.
var inherited = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "GORACE", "GOCOVERDIR"}

// Environ is the environment a plugin process starts with: the host's
// variables listed in inherited (and LC_*), then env, then the host's pid
// for the plugin's parent watch.
func Environ(env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(inherited, name) || strings.HasPrefix(name, "LC_") {
			out = append(out, kv)
		}
	}
	out = append(out, env...)
	return append(out, contract.ParentPIDEnv+"="+strconv.Itoa(os.Getpid()))
}

// Instance is one running plugin process.
type Instance struct {
	client   *plugin.Client
	served   *grpcPlugin
	shim     *clientShim
	manifest Manifest
	pid      int
	// host takes the log records a plugin ships with its answers, at
	// minLevel and above (the host logger's least enabled level).
	host     usherv1.HostServer
	minLevel slog.Level
}

// leastLevel is the least slog level l logs.
func leastLevel(l *slog.Logger) slog.Level {
	for _, lv := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if l.Enabled(context.Background(), lv) {
			return lv
		}
	}
	return slog.LevelError
}

// Start launches the plugin, completes the handshake, reads the manifest and
// checks it. A plugin whose manifest declares a kind without a guard is
// killed and refused with an error naming the kind.
func Start(ctx context.Context, cfg Config) (*Instance, error) {
	if cfg.InProcess != nil && cfg.Host != nil {
		return startInProcess(ctx, cfg)
	}
	if cfg.Path == "" || cfg.Host == nil {
		return nil, errors.New("pluginhost: Start needs Path and Host")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cmd := exec.Command(cfg.Path)
	cmd.Dir = cfg.Dir
	cmd.Env = Environ(cfg.Env)
	if u := cfg.osUser(); u != "" {
		cred, home, err := credential(u)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		// Its own user's, not the host's.
		cmd.Env = append(cmd.Env, "USER="+u, "LOGNAME="+u, "HOME="+home)
	}
	// The end of the plugin's stderr goes into the error of a plugin that
	// exited at start: it usually said why there.
	tail := &tailWriter{max: 1024}
	var stderr io.Writer = tail
	if cfg.Stderr != nil {
		stderr = io.MultiWriter(tail, cfg.Stderr)
	}
	var secure *plugin.SecureConfig
	if len(cfg.SHA256) > 0 {
		secure = &plugin.SecureConfig{Checksum: cfg.SHA256, Hash: newSHA256()}
	}
	served := &grpcPlugin{host: cfg.Host}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		VersionedPlugins: protocols(served),
		Cmd:              cmd,
		// cmd.Env is all a plugin gets of the host's environment.
		SkipHostEnv:      true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		SecureConfig:     secure,
		AutoMTLS:         true,
		// Multiplexed, the broker keeps the callback service reachable however
		// long the plugin waits for its first job; unmultiplexed, go-plugin
		// drops connection info nobody used within 5 s, and a plugin whose
		// first job came later could never call back.
		GRPCBrokerMultiplex: true,
		Logger:              hclogFor(cfg.Logger, cfg.Path),
		Stderr:              stderr,
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(contract.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(contract.MaxMessageBytes))},
	})
	inst, err := connect(ctx, client, served, cfg)
	if err != nil {
		kill(client, served) // waits for the stderr copy to finish
		if t := tail.String(); errors.Is(err, errExitedAtStart) && t != "" {
			err = fmt.Errorf("%w; the plugin's stderr ends with: %s", err, t)
		}
		return nil, fmt.Errorf("pluginhost: start %s: %w", cfg.Path, err)
	}
	return inst, nil
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(strings.Fields(strings.ToValidUTF8(string(w.buf), "")), " ")
}

func connect(ctx context.Context, client *plugin.Client, served *grpcPlugin, cfg Config) (*Instance, error) {
	proto, err := client.Client()
	if err != nil {
		return nil, explainStartError(err, cfg)
	}
	if err := proto.Ping(); err != nil {
		return nil, fmt.Errorf("the plugin does not answer its health check: %w", err)
	}
	raw, err := proto.Dispense(contract.PluginName)
	if err != nil {
		return nil, err
	}
	shim := raw.(*clientShim)
	m, err := shim.rpc.Manifest(ctx, &usherv1.ManifestRequest{})
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	manifest, err := checkManifest(m)
	if err != nil {
		return nil, err
	}
	manifest.Protocol = client.NegotiatedVersion()
	if cfg.Name != "" && manifest.Name != cfg.Name || cfg.Version != "" && manifest.Version != cfg.Version {
		return nil, fmt.Errorf("the binary reports plugin %q version %q, its manifest says %q version %q; refusing it",
			manifest.Name, manifest.Version, cfg.Name, cfg.Version)
	}
	inst := &Instance{client: client, served: served, shim: shim, manifest: manifest, host: cfg.Host, minLevel: leastLevel(cfg.Logger)}
	if rc := client.ReattachConfig(); rc != nil {
		inst.pid = rc.Pid
	}
	return inst, nil
}

var errExitedAtStart = errors.New("the plugin exited at start, before its handshake")

// explainStartError adds what an operator needs to the usual causes.
func explainStartError(err error, cfg Config) error {
	msg := err.Error()
	if perr, ok := protocolError(err); ok {
		return perr
	}
	switch {
	case errors.Is(err, plugin.ErrChecksumsDoNotMatch):
		got, herr := FileSHA256(cfg.Path)
		if herr != nil {
			got = "unreadable (" + herr.Error() + ")"
		}
		return fmt.Errorf("binary %s has SHA-256 %s, but %s was expected; refusing to start it: %w",
			cfg.Path, got, hex.EncodeToString(cfg.SHA256), err)
	case strings.Contains(msg, "Failed to read any lines from plugin's stdout"),
		strings.Contains(msg, "plugin exited before we could connect"):
		// go-plugin's text lists unlikely causes (architecture, file
		// permissions); the plugin's stderr, added by Start, says why.
		return errExitedAtStart
	case strings.Contains(msg, "Unrecognized remote plugin"):
		return fmt.Errorf("the plugin wrote to stdout before its handshake (write diagnostics to stderr): %w", err)
	}
	return err
}

// checkManifest refuses a manifest the host cannot route safely.
func checkManifest(m *usherv1.ManifestResponse) (Manifest, error) {
	out := Manifest{Name: m.GetName(), Version: m.GetVersion(), ProtocolVersion: int(m.GetProtocolVersion())}
	if out.Name == "" {
		return out, errors.New("manifest has no plugin name")
	}
	if len(m.GetKinds()) == 0 {
		return out, fmt.Errorf("plugin %s declares no kind", out.Name)
	}
	seen := map[string]bool{}
	for _, k := range m.GetKinds() {
		switch {
		case k.GetKind() == "":
			return out, fmt.Errorf("plugin %s declares a kind with no name", out.Name)
		case seen[k.GetKind()]:
			return out, fmt.Errorf("plugin %s declares kind %q twice", out.Name, k.GetKind())
		case k.GetGuard() == usherv1.Guard_GUARD_UNSPECIFIED || usherv1.Guard_name[int32(k.GetGuard())] == "":
			return out, fmt.Errorf("plugin %s declares kind %q without a guard; refusing to load it", out.Name, k.GetKind())
		case strings.HasPrefix(k.GetKind(), contract.WorkflowKindPrefix) != (k.GetGuard() == usherv1.Guard_GUARD_WORKFLOW):
			return out, fmt.Errorf("plugin %s declares kind %q under %s: the workflow guard serves exactly the kinds %s<type>; refusing to load it",
				out.Name, k.GetKind(), k.GetGuard(), contract.WorkflowKindPrefix)
		}
		seen[k.GetKind()] = true
		out.Kinds = append(out.Kinds, KindInfo{Kind: k.GetKind(), Guard: k.GetGuard(), SchemaVersion: int(k.GetPayloadSchemaVersion())})
	}
	return out, nil
}

// Manifest returns what the plugin reported at start.
func (i *Instance) Manifest() Manifest { return i.manifest }

// Pid returns the plugin process id.
func (i *Instance) Pid() int { return i.pid }

// Exited reports whether the plugin process has exited.
func (i *Instance) Exited() bool { return i.client != nil && i.client.Exited() }

// Kill stops the plugin process (gracefully first, then forcibly).
func (i *Instance) Kill() {
	if i.client != nil {
		kill(i.client, i.served)
	}
}

// kill stops the plugin's process and waits for what go-plugin runs for
// it (the stderr copy) and for its callback server: Kill returned, nothing
// of the instance logs or answers any more.
func kill(client *plugin.Client, served *grpcPlugin) {
	client.Kill()
	// go-plugin's Kill closes the broker when it had a connection, and
	// does not wait for the server on it. Closing is idempotent; done
	// here, it also covers a Kill that found none.
	served.mu.Lock()
	for _, b := range served.brokers {
		_ = b.Close()
	}
	served.mu.Unlock()
	served.serving.Wait()
}

// Invoke sends a batch of phase calls to the plugin. An error means the
// call itself failed (the process died, the connection broke, ctx ended).
func (i *Instance) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	res, err := i.shim.rpc.Invoke(ctx, &usherv1.InvokeRequest{HostBrokerId: i.shim.brokerID, Calls: calls,
		MinLogLevel: int32(i.minLevel)})
	if err != nil {
		return nil, err
	}
	if logs := res.GetLogs(); len(logs) > 0 {
		_, _ = i.host.Log(ctx, &usherv1.LogRequest{Records: logs})
	}
	// The caller checks the answer's shape: a wrong count is the plugin's
	// garbage (a permanent failure), not a broken call.
	return res.GetResults(), nil
}

func hclogFor(l *slog.Logger, path string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   "plugin",
		Level:  hclog.Warn,
		Output: slogWriter{l: l.With("plugin_path", path)},
	})
}

// slogWriter forwards go-plugin's log lines (and the plugin's stderr) into
// the host's slog logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Info(strings.TrimSpace(string(p)), "source", "go-plugin")
	return len(p), nil
}
