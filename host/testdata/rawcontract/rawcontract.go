// Package rawcontract is what the test plugins written against the raw
// protobuf contract (no SDK) share: go-plugin's shim and serve call, and
// the host's callback client, dialled once.
package rawcontract

import (
	"context"
	"sync"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Broker reaches the host's callback service.
type Broker struct {
	b    *plugin.GRPCBroker
	once sync.Once
	host usherv1.HostClient
	err  error
}

// Host dials the host's callback service (id from the first Invoke) once.
func (b *Broker) Host(id uint32) (usherv1.HostClient, error) {
	b.once.Do(func() {
		conn, err := b.b.Dial(id)
		if err != nil {
			b.err = err
			return
		}
		b.host = usherv1.NewHostClient(conn)
	})
	return b.host, b.err
}

type shim struct {
	plugin.NetRPCUnsupportedPlugin
	newServer func(*Broker) usherv1.PluginServer
}

func (s shim) GRPCServer(b *plugin.GRPCBroker, g *grpc.Server) error {
	usherv1.RegisterPluginServer(g, s.newServer(&Broker{b: b}))
	return nil
}

func (shim) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}

// Serve serves the plugin newServer builds, advertising the protocol
// versions given (contract.ProtocolVersion when none).
func Serve(newServer func(*Broker) usherv1.PluginServer, versions ...int) {
	if len(versions) == 0 {
		versions = []int{contract.ProtocolVersion}
	}
	sets := map[int]plugin.PluginSet{}
	for _, v := range versions {
		sets[v] = plugin.PluginSet{contract.PluginName: shim{newServer: newServer}}
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  contract.Handshake,
		VersionedPlugins: sets,
		GRPCServer:       plugin.DefaultGRPCServer,
	})
}

// Client is the host's callback client once Host has dialled it.
func (b *Broker) Client() usherv1.HostClient { return b.host }
