// Command fanout is a plugin whose record-the-job-id jobs enqueue from
// Apply: each fanout_parent job writes its row and enqueues one
// fanout_child job, which writes its own. The SDK runs a batch's calls
// concurrently, so a batch's Enqueue callbacks reach the host at once, on
// the batch's one transaction. TestBatchedEnqueues runs it.
package main

import (
	"context"

	"github.com/usherhq/usher/sdk"
)

// Parent is the job that fans out.
type Parent struct {
	N int64 `json:"n"`
}

func (Parent) Kind() string { return "fanout_parent" }

// Child is the job a parent enqueues.
type Child struct {
	N int64 `json:"n"`
}

func (Child) Kind() string { return "fanout_child" }

type parent struct{}

func (parent) Apply(ctx context.Context, job sdk.Job[Parent], tx *sdk.Tx) error {
	tx.Queue(sdk.Statement{SQL: `INSERT INTO fanout_rows (kind, n) VALUES ('parent', $1)`, Args: []any{job.Args.N}})
	return tx.Enqueue(ctx, Child(job.Args))
}

type child struct{}

func (child) Apply(ctx context.Context, job sdk.Job[Child], tx *sdk.Tx) error {
	tx.Queue(sdk.Statement{SQL: `INSERT INTO fanout_rows (kind, n) VALUES ('child', $1)`, Args: []any{job.Args.N}})
	return nil
}

func main() {
	p := sdk.New("fanout", "1.0.0")
	sdk.HandleRecordJobID(p, parent{})
	sdk.HandleRecordJobID(p, child{})
	sdk.Serve(p)
}
