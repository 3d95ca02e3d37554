// Package contract is the part of the host-plugin contract that both sides
// compile in: the go-plugin handshake, the plugin map name, the protocol
// version, the message limit, and the conversion between Go values and the
// protobuf Value. It lives below both the host and the SDK, so neither
// imports the other; handler authors never import it. The limit of a
// stream entry is not the plugins' business: it is internal/entry's
// MaxBytes.
package contract

import (
	"github.com/hashicorp/go-plugin"
)

// ProtocolVersion is the version of the host-plugin protocol this SDK speaks.
// The go-plugin handshake refuses a plugin built for another version with a
// message naming both.
const ProtocolVersion = 1

// PluginName is the key of the handler plugin in go-plugin's plugin map.
const PluginName = "handler"

// MaxMessageBytes bounds every gRPC message in both directions, on both the
// plugin connection and the broker's callback connection. go-plugin's
// default server accepts 4 MiB; usher sets the limit explicitly so both sides
// agree and refuse larger payloads with a clear error.
const MaxMessageBytes = 16 << 20

// Handshake is the go-plugin handshake. The magic cookie is not a security
// measure: it makes a plugin binary run by hand say it must be started by
// the host instead of hanging.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "USHER_PLUGIN",
	MagicCookieValue: "7c0d5b8e-usher-handler",
}

// ParentPIDEnv is the environment variable in which the host passes its pid,
// so that a plugin whose host died (kill -9 included) exits by itself.
const ParentPIDEnv = "USHER_HOST_PID"

// ManifestOnlyEnv is set (to 1) in the environment of a plugin the host
// starts only to read its manifest (`host plugins manifest`): no job will
// be invoked, and the plugin gets none of the settings a host passes with
// --plugin-env (sdk.ManifestOnly).
const ManifestOnlyEnv = "USHER_MANIFEST_ONLY"

// CPUProfileEnv names a file: a plugin started with it set profiles its
// CPU into that file between one SIGUSR1 and the next (sdk.Serve), so a
// benchmark can profile the plugin over the window it measures.
const CPUProfileEnv = "USHER_CPU_PROFILE"
