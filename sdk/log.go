package sdk

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// hostError turns a gRPC status from the host into a plain error carrying
// the host's message; a refused capability becomes a permanent failure,
// because retrying the same handler code cannot make it allowed.
func hostError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := fmt.Errorf("host: %s", st.Message())
	if st.Code() == codes.PermissionDenied || st.Code() == codes.InvalidArgument {
		return Permanent(e)
	}
	return e
}

// jobLogger returns a logger whose records go to the host's log, tagged with
// the job's identity, request_id and trace.
func (h *hostClient) jobLogger(job *usherv1.Job, batch *logBatch) *slog.Logger {
	return slog.New(&hostLogHandler{host: h, job: job, batch: batch})
}

// logBatch collects one Invoke's records below warn level; they travel
// back with its answer instead of a Host.Log call each.
type logBatch struct {
	min   slog.Level
	mu    sync.Mutex
	recs  []*usherv1.LogRecord
	bytes int
}

// maxBatchedLogBytes bounds the records one answer carries: past it, a
// record goes through Host.Log at once, so a chatty call cannot grow its
// answer past the message limit.
const maxBatchedLogBytes = 1 << 20

// add keeps r for the answer, or reports that the batch is full.
func (b *logBatch) add(r *usherv1.LogRecord) bool {
	n := proto.Size(r)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bytes+n > maxBatchedLogBytes {
		return false
	}
	b.bytes += n
	b.recs = append(b.recs, r)
	return true
}

func (b *logBatch) take() []*usherv1.LogRecord {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.recs
	b.recs = nil
	return r
}

type hostLogHandler struct {
	host  *hostClient
	job   *usherv1.Job
	batch *logBatch
	attrs []slog.Attr
}

// Enabled drops what the host would not log anyway.
func (l *hostLogHandler) Enabled(_ context.Context, level slog.Level) bool {
	return l.batch == nil || level >= l.batch.min
}

func (l *hostLogHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := &usherv1.LogRecord{
		Level: int32(r.Level), Message: r.Message, Attrs: map[string]string{},
		JobId: l.job.GetId(), RequestId: l.job.GetRequestId(), Trace: l.job.GetTrace(),
	}
	for _, a := range l.attrs {
		putAttr(rec, a)
	}
	r.Attrs(func(a slog.Attr) bool {
		putAttr(rec, a)
		return true
	})
	if l.batch != nil && r.Level < slog.LevelWarn && l.batch.add(rec) {
		return nil
	}
	_, err := l.host.c.Log(ctx, &usherv1.LogRequest{Records: []*usherv1.LogRecord{rec}})
	return err
}

func (l *hostLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &hostLogHandler{host: l.host, job: l.job, batch: l.batch, attrs: append(append([]slog.Attr{}, l.attrs...), attrs...)}
}

func (l *hostLogHandler) WithGroup(string) slog.Handler { return l }

// putAttr adds a to rec: numbers, booleans and times keep their type (the
// host logs them as such), anything else goes as its text.
func putAttr(rec *usherv1.LogRecord, a slog.Attr) {
	v := a.Value.Resolve()
	var w *usherv1.Value
	switch v.Kind() {
	case slog.KindInt64:
		w = &usherv1.Value{Kind: &usherv1.Value_Int{Int: v.Int64()}}
	case slog.KindUint64:
		if u := v.Uint64(); u <= math.MaxInt64 {
			w = &usherv1.Value{Kind: &usherv1.Value_Int{Int: int64(u)}}
		}
	case slog.KindFloat64:
		w = &usherv1.Value{Kind: &usherv1.Value_Float{Float: v.Float64()}}
	case slog.KindBool:
		w = &usherv1.Value{Kind: &usherv1.Value_Bool{Bool: v.Bool()}}
	case slog.KindTime:
		w = &usherv1.Value{Kind: &usherv1.Value_TimeUnixNanos{TimeUnixNanos: v.Time().UnixNano()}}
	}
	if w == nil {
		rec.Attrs[a.Key] = v.String()
		return
	}
	if rec.Values == nil {
		rec.Values = map[string]*usherv1.Value{}
	}
	rec.Values[a.Key] = w
}
