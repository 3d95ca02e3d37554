package guard

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Two batches whose jobs write the same rows send them in one order,
// whatever order their jobs came in: by the first write's SQL and
// arguments, with each job's writes kept together and in their order.
func TestWritesInLockOrder(t *testing.T) {
	counter := func(event int64, more ...*usherv1.Statement) *writePart {
		ws := []*usherv1.Statement{{Mode: usherv1.Mode_MODE_EXEC, Sql: "UPDATE events SET seats_sold = seats_sold + 1 WHERE id = $1",
			Args: []*usherv1.Value{{Kind: &usherv1.Value_Int{Int: event}}}}}
		return &writePart{ws: append(ws, more...)}
	}
	note := &usherv1.Statement{Mode: usherv1.Mode_MODE_EXEC, Sql: "INSERT INTO notes VALUES ($1)", Args: []*usherv1.Value{{Kind: &usherv1.Value_Text{Text: "x"}}}}
	e5, e3, e4 := counter(5, note), counter(3), counter(4)
	none := &writePart{}
	one := inLockOrder([]*writePart{e5, e3, none, e4})
	other := inLockOrder([]*writePart{e4, none, e5, e3})
	require.Equal(t, one, other)
	require.Equal(t, []*writePart{none, e3, e4, e5}, one)
	require.Same(t, note, one[3].ws[1], "a job's writes stay together, in its order")
}

// A batch's jobs fit in its one Invoke: take stops at batchBytes
// of them, encoded, whatever BatchMax allows, and a job over it alone
// still runs, by itself.
func TestTakeBoundsTheBatchsPayload(t *testing.T) {
	r := &Runner{cfg: Config{BatchMax: 128}}
	req := func(id string, size int) *batchReq {
		return &batchReq{job: &usherv1.Job{Kind: "k", Id: id, Payload: make([]byte, size)}}
	}
	quarter := batchBytes/4 - 64 // a job's other fields, encoded, take a few bytes
	b := &batcher{queue: []*batchReq{req("a", quarter), req("b", quarter), req("c", quarter), req("d", quarter), req("e", 1000)}}
	first := r.take(b)
	require.Len(t, first, 4, "four quarters fill a batch")
	require.Equal(t, "e", b.queue[0].job.Id)

	b = &batcher{queue: []*batchReq{req("big", batchBytes+1), req("small", 1)}}
	first = r.take(b)
	require.Len(t, first, 1)
	require.Equal(t, "big", first[0].job.Id, "a job larger than the bound still runs, alone")
	require.Len(t, r.take(b), 1)
}

// A batch's call-off and overtake times grow with its jobs: after calls
// of 5 jobs that took 1 ms, a batch of 128 gets the time of 128 such
// jobs, one of 5 the same as before.
func TestBatchTimesScaleWithTheBatch(t *testing.T) {
	r := &Runner{cfg: Config{StalledAfter: 2 * time.Second}}
	b := &batcher{}
	for range 8 {
		b.answered(time.Millisecond, 5)
	}
	overtake, callOff := r.batchTimes(b, 5)
	require.Equal(t, 4*time.Millisecond, overtake, "4 x 1 ms, as before")
	require.Equal(t, callOffFloor, callOff, "20 x 1 ms is under the floor")
	overtake, callOff = r.batchTimes(b, 128)
	grown := time.Duration(float64(time.Millisecond) * math.Sqrt(128.0/5))
	require.Equal(t, overtakeFactor*grown, overtake)
	require.Equal(t, callOffFactor*grown, callOff)
	require.Greater(t, callOff, 128*time.Millisecond/5, "a call all of whose time grows with its jobs is covered")
	_, callOff = r.batchTimes(b, 100000)
	require.Equal(t, r.cfg.StalledAfter, callOff, "never past StalledAfter")

	// After batches of one on a loaded machine, a batch of five is given
	// 20 x sqrt(5) of the slowest, not 20 x 5 (StalledAfter here, as
	// in TestStalledJobHoldsOnlyItself).
	r = &Runner{cfg: Config{StalledAfter: 5 * time.Second}}
	b = &batcher{}
	for range 8 {
		b.answered(50*time.Millisecond, 1)
	}
	_, callOff = r.batchTimes(b, 5)
	require.Equal(t, callOffFactor*time.Duration(float64(50*time.Millisecond)*math.Sqrt(5)), callOff)
	require.Less(t, callOff, r.cfg.StalledAfter)
	_, callOff = r.batchTimes(b, 1)
	require.Equal(t, callOffFactor*50*time.Millisecond, callOff, "a batch no bigger is given the calls' own times")
}
