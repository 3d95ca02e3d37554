package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/internal/bridge"
)

// Serve runs the plugin until the host stops it; it is a plugin's whole main.
// It exits with status 1 when registration was wrong (an empty or duplicated
// kind), and by itself when the host that started it is gone.
//
// With contract.CPUProfileEnv set, SIGUSR1 starts and stops a CPU profile of
// the plugin (make bench's --cpu-profile).
//
// Nothing may be written to stdout before Serve: go-plugin's handshake is the
// first line the host reads there. Write diagnostics to stderr.
func Serve(p *Plugin) {
	if err := p.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if len(p.kinds) == 0 {
		fmt.Fprintln(os.Stderr, "sdk: plugin registers no kind")
		os.Exit(1)
	}
	go watchParent(time.Second)
	defer profileOnSignal()()
	logger := hclog.New(&hclog.LoggerOptions{Name: p.name, Output: os.Stderr, JSONFormat: true, Level: hclog.Info})
	p.logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: contract.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			contract.ProtocolVersion: {contract.PluginName: &grpcPlugin{p: p}},
		},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts,
				grpc.MaxRecvMsgSize(contract.MaxMessageBytes),
				grpc.MaxSendMsgSize(contract.MaxMessageBytes))...)
		},
		Logger: logger,
	})
}

// ManifestOnly reports whether the host started this process only to read
// its manifest (`host plugins manifest`): it will invoke no job, and passes
// none of the settings `host run --plugin-env` would. A plugin that stops
// at start when a setting is missing (its provider's URL, a directory)
// checks them only when ManifestOnly is false; its name, version and
// kinds must not depend on them.
func ManifestOnly() bool { return os.Getenv(contract.ManifestOnlyEnv) != "" }

// watchParent exits the process when the host that started it has died, so a
// kill -9 of the host leaves no orphaned plugins. go-plugin alone does not.
func watchParent(every time.Duration) {
	want := os.Getppid()
	if s := os.Getenv(contract.ParentPIDEnv); s != "" {
		if pid, err := strconv.Atoi(s); err == nil {
			want = pid
		}
	}
	for range time.Tick(every) {
		if os.Getppid() != want {
			fmt.Fprintf(os.Stderr, "sdk: host process %d is gone; exiting\n", want)
			os.Exit(3)
		}
	}
}

// grpcPlugin is the go-plugin shim on the plugin side.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	p *Plugin
}

func (g *grpcPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	usherv1.RegisterPluginServer(s, &pluginServer{p: g.p, broker: broker, hosts: map[uint32]*hostClient{}})
	return nil
}

func (g *grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("sdk: a plugin serves; it has no client side")
}

var _ plugin.GRPCPlugin = (*grpcPlugin)(nil)

func init() {
	bridge.NewPluginServer = func(p any, host usherv1.HostClient) usherv1.PluginServer {
		return &pluginServer{p: p.(*Plugin), local: &hostClient{c: host}}
	}
}

type pluginServer struct {
	usherv1.UnimplementedPluginServer
	p      *Plugin
	broker *plugin.GRPCBroker
	// local, when set, is the host of an in-process server (sdktest).
	local *hostClient

	mu    sync.Mutex
	hosts map[uint32]*hostClient
}

func (s *pluginServer) Manifest(context.Context, *usherv1.ManifestRequest) (*usherv1.ManifestResponse, error) {
	return s.p.manifest(), nil
}

// Invoke runs the batch's calls concurrently (calls: each on a goroutine of
// its own for the call's length); each result lands at its call's index.
func (s *pluginServer) Invoke(ctx context.Context, req *usherv1.InvokeRequest) (*usherv1.InvokeResponse, error) {
	host, err := s.host(req.GetHostBrokerId())
	if err != nil {
		return nil, err
	}
	logs := &logBatch{min: slog.Level(req.GetMinLogLevel())}
	env := invokeEnv{host: host, logger: func(job *usherv1.Job) *slog.Logger { return host.jobLogger(job, logs) },
		middleware: s.p.middleware}
	results := make([]*usherv1.Result, len(req.GetCalls()))
	var wg sync.WaitGroup
	for i, call := range req.GetCalls() {
		kind := call.GetJob().GetKind()
		h := s.p.kinds[kind]
		if h == nil {
			results[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT,
				Error: fmt.Sprintf("plugin %s serves no kind %q", s.p.name, kind)}
			continue
		}
		wg.Add(1)
		calls.run(func() {
			defer wg.Done()
			results[i] = safely(kind, func() *usherv1.Result { return h.invoke(ctx, env, call) })
		})
	}
	wg.Wait()
	return &usherv1.InvokeResponse{Results: results, Logs: logs.take()}, nil
}

// host returns the callback client for a broker id, dialling once: the host
// serves one long-lived callback server per plugin instance.
func (s *pluginServer) host(id uint32) (*hostClient, error) {
	if s.local != nil {
		return s.local, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.hosts[id]; c != nil {
		return c, nil
	}
	conn, err := s.broker.DialWithOptions(id, grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(contract.MaxMessageBytes),
		grpc.MaxCallSendMsgSize(contract.MaxMessageBytes)))
	if err != nil {
		return nil, fmt.Errorf("sdk: dial host callback service %d: %w", id, err)
	}
	c := &hostClient{c: usherv1.NewHostClient(conn)}
	s.hosts[id] = c
	return c, nil
}

// hostClient is the plugin's client of the host's callback service.
type hostClient struct {
	c usherv1.HostClient
}

func (h *hostClient) exec(ctx context.Context, handle string, stmts []*usherv1.Statement) ([]*usherv1.StatementResult, error) {
	res, err := h.c.Exec(ctx, &usherv1.ExecRequest{Handle: handle, Statements: stmts})
	if err != nil {
		return nil, hostError(err)
	}
	return res.GetResults(), nil
}

func (h *hostClient) enqueue(ctx context.Context, handle string, msgs []*usherv1.OutboxMessage) ([]int64, error) {
	res, err := h.c.Enqueue(ctx, &usherv1.EnqueueRequest{Handle: handle, Messages: msgs})
	if err != nil {
		return nil, hostError(err)
	}
	return res.GetOutboxIds(), nil
}

var _ hostCaller = (*hostClient)(nil)
