package pluginhost_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// BenchmarkInvoke measures a go-plugin round trip to a real plugin process,
// per phase call, with one call per RPC and with 32 calls batched in one
// RPC. The claim phase of send_tickets is pure (no database), so this is
// the protocol's cost alone. ns/op is per call.
func BenchmarkInvoke(b *testing.B) {
	bin := hosttest.Build(b, "./plugins/tickets")
	inst, err := pluginhost.Start(context.Background(), pluginhost.Config{
		Path: bin, Host: guard.NewHandles("public", hosttest.Logger(b, 100)), Logger: hosttest.Logger(b, 100),
		Env: []string{"USHER_BLOB_DIR=" + b.TempDir(), "MAILPROVIDER_URL=http://127.0.0.1:8025"},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer inst.Kill()
	for _, batch := range []int{1, 32} {
		calls := make([]*usherv1.Call, batch)
		for i := range calls {
			payload, _ := json.Marshal(map[string]int{"order_id": i + 1})
			calls[i] = &usherv1.Call{Phase: usherv1.Phase_PHASE_CLAIM, Job: &usherv1.Job{Id: fmt.Sprint(i), Kind: "send_tickets", Payload: payload}}
		}
		for _, parallel := range []bool{false, true} {
			name := fmt.Sprintf("calls_per_rpc=%d/parallel=%v", batch, parallel)
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				invoke := func() {
					res, err := inst.Invoke(ctx, calls)
					if err != nil || len(res) != batch || res[0].GetOutcome() != usherv1.Outcome_OUTCOME_OK {
						b.Fatalf("invoke: %v %v", err, res)
					}
				}
				b.ResetTimer()
				if parallel {
					b.SetParallelism(16)
					b.RunParallel(func(pb *testing.PB) {
						// Each goroutine sends one RPC per batch of calls.
						n := 0
						for pb.Next() {
							if n%batch == 0 {
								invoke()
							}
							n++
						}
					})
					return
				}
				for range max(b.N/batch, 1) {
					invoke()
				}
			})
		}
	}
}
