package pluginhost

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/grpc"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// startInProcess serves cfg.InProcess's plugin inside the host's process:
// the host's calls and the plugin's callbacks are plain method calls. The
// handler still runs every statement through the host's handles, on the
// plugin's own database role; only the process, gRPC and the broker are
// gone. It exists to measure what those cost (cmd/bench).
func startInProcess(ctx context.Context, cfg Config) (*Instance, error) {
	srv := cfg.InProcess(hostCalls{cfg.Host})
	shim := &clientShim{rpc: pluginCalls{srv}}
	m, err := shim.rpc.Manifest(ctx, &usherv1.ManifestRequest{})
	if err != nil {
		return nil, fmt.Errorf("pluginhost: in-process plugin: read manifest: %w", err)
	}
	manifest, err := checkManifest(m)
	if err != nil {
		return nil, fmt.Errorf("pluginhost: in-process plugin: %w", err)
	}
	manifest.Protocol = manifest.ProtocolVersion
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Instance{shim: shim, manifest: manifest, pid: os.Getpid(), host: cfg.Host, minLevel: leastLevel(cfg.Logger)}, nil
}

// pluginCalls is a PluginClient that calls a PluginServer directly.
type pluginCalls struct{ s usherv1.PluginServer }

func (p pluginCalls) Manifest(ctx context.Context, in *usherv1.ManifestRequest, _ ...grpc.CallOption) (*usherv1.ManifestResponse, error) {
	return p.s.Manifest(ctx, in)
}

func (p pluginCalls) Invoke(ctx context.Context, in *usherv1.InvokeRequest, _ ...grpc.CallOption) (*usherv1.InvokeResponse, error) {
	return p.s.Invoke(ctx, in)
}

// hostCalls is a HostClient that calls a HostServer directly.
type hostCalls struct{ s usherv1.HostServer }

func (h hostCalls) Exec(ctx context.Context, in *usherv1.ExecRequest, _ ...grpc.CallOption) (*usherv1.ExecResponse, error) {
	return h.s.Exec(ctx, in)
}

func (h hostCalls) Enqueue(ctx context.Context, in *usherv1.EnqueueRequest, _ ...grpc.CallOption) (*usherv1.EnqueueResponse, error) {
	return h.s.Enqueue(ctx, in)
}

func (h hostCalls) Log(ctx context.Context, in *usherv1.LogRequest, _ ...grpc.CallOption) (*usherv1.LogResponse, error) {
	return h.s.Log(ctx, in)
}
