package host

import (
	"context"

	"github.com/usherhq/usher/host/stream"
)

// DispatchForTest runs e as the stream consumer hands it over.
func (h *Host) DispatchForTest(ctx context.Context, e stream.Entry) bool { return h.dispatch(ctx, e) }
