// Package inprocess serves a plugin inside the host's process, for
// measuring what the plugin boundary costs: host.LoadInProcess(ctx, name,
// inprocess.Server(p)) runs p's handlers through the same handles, guards
// and database role as a plugin process, with method calls where a
// process would have gRPC. cmd/bench uses it; an in-process plugin is not
// isolated from the host, so production plugins are separate processes.
package inprocess

import (
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/internal/bridge"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Server returns what host.LoadInProcess serves: p's plugin service, its
// callbacks going to the host it is given.
func Server(p *sdk.Plugin) func(usherv1.HostClient) usherv1.PluginServer {
	return func(host usherv1.HostClient) usherv1.PluginServer { return bridge.NewPluginServer(p, host) }
}
