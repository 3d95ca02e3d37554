package entry_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/internal/entry"
)

var testKey = bytes.Repeat([]byte{7}, entry.MinKeyLen)

func sample() entry.Fields {
	return entry.Fields{JobID: "41", OutboxID: "41", Kind: "update_sales_counter", Payload: `{"order_id":7}`,
		RequestID: "req-1", Trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Attempt: "0"}
}

func TestSignVerifies(t *testing.T) {
	t.Parallel()
	f := sample()
	sig := f.Sign(testKey)
	require.Len(t, sig, 64, "hex of an HMAC-SHA256")
	require.True(t, f.Verify(testKey, sig))
	// Pinned: a change of the encoding would make every host of a rolling
	// upgrade dead-letter the other version's entries. (Checked against
	// Python's hmac over the same length-prefixed bytes.)
	require.Equal(t, "1b678f0bac22c368243c802900dc6555f2a9263b78efe203e43936ee7497b265", sig)
}

func TestSignCoversEveryField(t *testing.T) {
	t.Parallel()
	sig := sample().Sign(testKey)
	alter := []func(*entry.Fields){
		func(f *entry.Fields) { f.JobID = "42" },
		func(f *entry.Fields) { f.OutboxID = "42" },
		func(f *entry.Fields) { f.Kind = "send_tickets" },
		func(f *entry.Fields) { f.Payload = `{"order_id":8}` },
		func(f *entry.Fields) { f.RequestID = "req-2" },
		func(f *entry.Fields) { f.Trace = "" },
		func(f *entry.Fields) { f.Attempt = "1" },
		func(f *entry.Fields) { f.Step = "1" },
		func(f *entry.Fields) { f.Priority = "1" },
	}
	for i, a := range alter {
		f := sample()
		a(&f)
		require.False(t, f.Verify(testKey, sig), "alteration %d still verifies", i)
	}
}

// Bytes moved from one field to the next change the signature: the
// encoding is length-prefixed, not concatenated.
func TestSignIsUnambiguous(t *testing.T) {
	t.Parallel()
	a := entry.Fields{JobID: "1", Kind: "k", Payload: `{"a":1}`, RequestID: "r"}
	b := entry.Fields{JobID: "1", Kind: "k", Payload: `{"a":1}r`}
	require.NotEqual(t, a.Sign(testKey), b.Sign(testKey))
	c := entry.Fields{JobID: "12", Kind: "k"}
	d := entry.Fields{JobID: "1", OutboxID: "2", Kind: "k"}
	require.NotEqual(t, c.Sign(testKey), d.Sign(testKey))
}

func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	f := sample()
	sig := f.Sign(testKey)
	other := bytes.Repeat([]byte{8}, entry.MinKeyLen)
	require.False(t, f.Verify(other, sig), "another cluster's key")
	require.False(t, f.Verify(testKey, ""), "no signature")
	require.False(t, f.Verify(testKey, "zz"+sig[2:]), "not hex")
	require.False(t, f.Verify(testKey, sig[:62]), "truncated")
	require.False(t, f.Verify(testKey, sig+"00"), "extended")
}

// Values carries every field and a signature FieldsOf reads back.
func TestValuesRoundTrip(t *testing.T) {
	t.Parallel()
	vals := sample().Values(testKey)
	m := map[string]any{}
	for i := 0; i < len(vals); i += 2 {
		m[vals[i].(string)] = vals[i+1]
	}
	require.Equal(t, sample(), entry.FieldsOf(m))
	require.True(t, entry.FieldsOf(m).Verify(testKey, m[entry.FieldSig].(string)))
	require.NotContains(t, m, entry.FieldStep, "an entry that is no step has no step field")
}

// A workflow step's entry carries the step field, signed: removing it (a
// step made to look like a plain job, so its cancel is not asked about)
// or adding it breaks the signature, and a step entry's encoding cannot
// be another entry's with its attempt moved.
func TestStepFieldIsSigned(t *testing.T) {
	t.Parallel()
	step := sample()
	step.Step = "1"
	vals := step.Values(testKey)
	m := map[string]any{}
	for i := 0; i < len(vals); i += 2 {
		m[vals[i].(string)] = vals[i+1]
	}
	require.Equal(t, step, entry.FieldsOf(m))
	sig := m[entry.FieldSig].(string)
	require.True(t, entry.FieldsOf(m).Verify(testKey, sig))
	require.False(t, sample().Verify(testKey, sig), "the step field dropped")
	require.False(t, step.Verify(testKey, sample().Sign(testKey)), "the step field added")
	moved := sample()
	moved.Attempt = "0\x00\x00\x00\x00\x00\x00\x00\x011"
	require.NotEqual(t, step.Sign(testKey), moved.Sign(testKey))
}

// A job's priority is signed when it is not the default: dropping it (a
// high-priority job made to look ordinary), adding it or moving it into
// the step field breaks the signature.
func TestPriorityFieldIsSigned(t *testing.T) {
	t.Parallel()
	high := sample()
	high.Priority = "1"
	vals := high.Values(testKey)
	m := map[string]any{}
	for i := 0; i < len(vals); i += 2 {
		m[vals[i].(string)] = vals[i+1]
	}
	require.Equal(t, high, entry.FieldsOf(m))
	sig := m[entry.FieldSig].(string)
	require.True(t, entry.FieldsOf(m).Verify(testKey, sig))
	require.False(t, sample().Verify(testKey, sig), "the priority dropped")
	require.False(t, high.Verify(testKey, sample().Sign(testKey)), "the priority added")
	step := sample()
	step.Step = "1"
	require.NotEqual(t, step.Sign(testKey), high.Sign(testKey), "a step and a priority of the same text")
	both := high
	both.Step = entry.FieldPriority
	asStep := sample()
	asStep.Step = entry.FieldPriority
	require.NotEqual(t, both.Sign(testKey), asStep.Sign(testKey))
	require.NotContains(t, sample().Values(testKey), entry.FieldPriority, "an entry of the default priority has no priority field")
}
