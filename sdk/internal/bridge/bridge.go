// Package bridge lets sdk/sdktest serve a *sdk.Plugin in-process, without
// go-plugin, and without putting generated types into the sdk package's
// public API. The sdk package fills NewPluginServer at init.
package bridge

import usherv1 "github.com/usherhq/usher/proto/usher/v1"

// NewPluginServer returns the plugin-side gRPC service for p (a *sdk.Plugin)
// whose callbacks go to host.
var NewPluginServer func(p any, host usherv1.HostClient) usherv1.PluginServer
