package wfmsg_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/internal/wfmsg"
)

func TestChecksNameTheLimit(t *testing.T) {
	t.Parallel()
	require.NoError(t, wfmsg.CheckStart("trip", "t1", []byte(`{}`)))
	require.ErrorContains(t, wfmsg.CheckStart("", "t1", []byte(`{}`)), "workflow type is empty")
	require.ErrorContains(t, wfmsg.CheckStart(strings.Repeat("t", 101), "t1", []byte(`{}`)), "wfmsg.MaxTypeBytes")
	require.ErrorContains(t, wfmsg.CheckStart("trip", strings.Repeat("i", 257), []byte(`{}`)), "wfmsg.MaxIDBytes")
	require.ErrorContains(t, wfmsg.CheckStart("trip", "t1", make([]byte, wfmsg.MaxInputBytes+1)), "wfmsg.MaxInputBytes")
	require.ErrorContains(t, wfmsg.CheckStart("trip", "t1", []byte(`{`)), "not valid JSON")
	require.NoError(t, wfmsg.CheckSignal("s1", "paid", []byte(`null`)))
	require.ErrorContains(t, wfmsg.CheckSignal("", "paid", []byte(`null`)), "signal id is empty")
	require.ErrorContains(t, wfmsg.CheckSignal("s1", "paid", make([]byte, wfmsg.MaxSignalBytes+1)), "wfmsg.MaxSignalBytes")
}
