package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
)

// Jobs waiting for a host that serves their kind (host.Config
// UnknownKindWait) show in inspect, by kind; finished ones do not, and
// without any the section is left out.
func TestInspectShowsJobsWaitingForTheirKind(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	ctx := context.Background()
	in, err := ops.Inspect(ctx, pool, rdb, stream, "usher", time.Now())
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, printInspection(&out, in))
	require.NotContains(t, out.String(), "waiting for a host")

	_, err = pool.Exec(ctx, `INSERT INTO outbox (kind, payload, published_at, kind_waited_at, done_at) VALUES
		('new_kind', '{}', now(), now(), NULL), ('new_kind', '{}', now(), now(), NULL),
		('new_kind', '{}', now(), now(), now()), ('other', '{}', now(), NULL, NULL)`)
	require.NoError(t, err)
	in, err = ops.Inspect(ctx, pool, rdb, stream, "usher", time.Now())
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, printInspection(&out, in))
	require.Contains(t, out.String(), "waiting for a host serving their kind\n  KIND      JOBS\n  new_kind  2\n")
	b, err := json.Marshal(in)
	require.NoError(t, err)
	require.Contains(t, string(b), `"waiting_for_kind":[{"kind":"new_kind","count":2}]`)
}
