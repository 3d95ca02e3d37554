// Command rawplugin is a plugin written against the protobuf contract with
// no SDK, for tests that prove the host enforces what the SDK's types
// promise. RAW_MODE picks its misbehaviour:
//
//	noguard        manifest declares raw_job without a guard
//	garbage        Invoke answers with no results
//	badoutcome     Invoke answers an unknown outcome
//	check-write    the check phase runs an UPDATE through its read-only handle
//	exec-first     the commit phase runs a plain write before any conditional write
//	enqueue-first  the commit phase enqueues before any conditional write
//	no-write-if    the commit phase makes no conditional write at all
//	stale-handle   the commit phase reuses the check phase's handle
//	panic          the process panics in Invoke (crashes)
//	hang           Invoke never returns
//	stdout         writes to stdout before the handshake
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/wire"
)

var mode = os.Getenv("RAW_MODE")

type shim struct {
	plugin.NetRPCUnsupportedPlugin
}

func (shim) GRPCServer(b *plugin.GRPCBroker, s *grpc.Server) error {
	usherv1.RegisterPluginServer(s, &server{broker: b})
	return nil
}

func (shim) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}

type server struct {
	usherv1.UnimplementedPluginServer
	broker    *plugin.GRPCBroker
	host      usherv1.HostClient
	lastCheck string
}

func (s *server) Manifest(context.Context, *usherv1.ManifestRequest) (*usherv1.ManifestResponse, error) {
	g := usherv1.Guard_GUARD_STATE_FIRST
	if mode == "noguard" {
		g = usherv1.Guard_GUARD_UNSPECIFIED
	}
	return &usherv1.ManifestResponse{Name: "raw", Version: "0.0.1", ProtocolVersion: wire.ProtocolVersion,
		Kinds: []*usherv1.KindInfo{{Kind: "raw_job", Guard: g}}}, nil
}

func (s *server) Invoke(ctx context.Context, req *usherv1.InvokeRequest) (*usherv1.InvokeResponse, error) {
	if s.host == nil {
		conn, err := s.broker.Dial(req.GetHostBrokerId())
		if err != nil {
			return nil, err
		}
		s.host = usherv1.NewHostClient(conn)
	}
	switch mode {
	case "garbage":
		return &usherv1.InvokeResponse{}, nil
	case "badoutcome":
		return &usherv1.InvokeResponse{Results: []*usherv1.Result{{Outcome: 99}}}, nil
	case "panic":
		panic("rawplugin: panic in Invoke")
	case "hang":
		select {}
	}
	call := req.GetCalls()[0]
	res := s.phase(ctx, call)
	return &usherv1.InvokeResponse{Results: []*usherv1.Result{res}}, nil
}

func fail(err error) *usherv1.Result {
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: err.Error()}
}

func (s *server) exec(ctx context.Context, handle string, mode usherv1.Mode, sql string) error {
	_, err := s.host.Exec(ctx, &usherv1.ExecRequest{Handle: handle, Statements: []*usherv1.Statement{{Mode: mode, Sql: sql}}})
	return err
}

func (s *server) phase(ctx context.Context, call *usherv1.Call) *usherv1.Result {
	ok := &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK}
	switch call.GetPhase() {
	case usherv1.Phase_PHASE_CHECK:
		s.lastCheck = call.GetHandle()
		if mode == "check-write" {
			if err := s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_QUERY, "UPDATE events SET seats_sold = seats_sold + 1000"); err != nil {
				return fail(err)
			}
		}
		return ok
	case usherv1.Phase_PHASE_PREPARE:
		return ok
	case usherv1.Phase_PHASE_COMMIT:
		var err error
		switch mode {
		case "exec-first":
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_EXEC, "UPDATE events SET seats_sold = seats_sold + 1000")
		case "enqueue-first":
			_, err = s.host.Enqueue(ctx, &usherv1.EnqueueRequest{Handle: call.GetHandle(),
				Messages: []*usherv1.OutboxMessage{{Kind: "raw_job", Payload: []byte(`{}`)}}})
		case "stale-handle":
			err = s.exec(ctx, s.lastCheck, usherv1.Mode_MODE_QUERY, "SELECT 1")
		case "no-write-if":
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_QUERY, "SELECT 1")
		default:
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_WRITE_IF, "UPDATE events SET seats_sold = seats_sold WHERE false RETURNING id")
		}
		if err != nil {
			return fail(err)
		}
		return ok
	}
	return fail(fmt.Errorf("unexpected phase %v", call.GetPhase()))
}

func main() {
	if mode == "stdout" {
		fmt.Println("hello from a plugin that should not print here")
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			wire.ProtocolVersion: {wire.PluginName: shim{}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}
