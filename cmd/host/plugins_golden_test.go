package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/swaps"
)

// `host plugins list`, text and --json, on a known state: what a host's
// admin API answers for two plugins, one swapped to 2.0.0 and rolled back
// (with jobs in flight and its swap history from two hosts), one on
// probation after its first swap. The admin API is a stand-in serving
// host.PluginStatus, the type the host encodes; the live path is
// TestPluginsCommandsAgainstRunningHost. Run with -update to rewrite
// testdata/plugins-list*.golden.
func TestPluginsListGolden(t *testing.T) {
	t.Parallel()
	at := func(min int) time.Time { return goldenCreated.Add(time.Duration(min) * time.Minute) }
	until := at(95)
	list := []host.PluginStatus{
		{Name: "counters", Version: "1.0.0", Protocol: 1, Path: "/srv/usher/plugins/counters",
			Manifest: "/srv/usher/plugins/counters.plugin.json", SHA256: strings.Repeat("ab", 32),
			DBRole: "usher_plugin_counters", DBPoolSize: 8, Pid: 4242, Healthy: true, Restarts: 1, Parked: 7, ParkedNow: 2, InFlight: 3,
			Kinds: []string{"update_sales_counter (job id recorded)"},
			LastRollback: &host.RollbackStatus{At: at(20), From: "2.0.0", To: "1.0.0", Cause: "failures",
				Reason: "5 of its first 5 jobs failed with errors (crashes, abandoned runs, transient errors) within 1.2s of the swap"},
			Refused: "2.0.0", RefusedReason: "rolled back from 2.0.0 to 1.0.0 (failures)",
			Swaps: []swaps.Swap{
				{At: at(20), Host: "host-a", Plugin: "counters", Action: swaps.RolledBack, From: "2.0.0", To: "1.0.0", Cause: "failures",
					Reason: "5 of its first 5 jobs failed with errors"},
				{At: at(19), Host: "host-a", Plugin: "counters", Action: swaps.Swapped, From: "1.0.0", To: "2.0.0", Cause: swaps.CauseDirChange},
				{At: at(10), Host: "host-b", Plugin: "counters", Action: swaps.Refused, From: "1.0.0", To: "1.5.0", Cause: swaps.CauseReload,
					Reason: "manifest counters.plugin.json: sha256 mismatch"},
			}},
		{Name: "tickets", Version: "3.1.0", Protocol: 1, Path: "/srv/usher/plugins/tickets",
			Manifest: "/srv/usher/plugins/tickets.plugin.json", SHA256: strings.Repeat("cd", 32),
			DBRole: "usher_plugin_tickets", DBPoolSize: 8, Pid: 4243, Healthy: true,
			Kinds:    []string{"render_tickets (state first)", "send_tickets (claim the effect)"},
			Previous: "3.0.0", ProbationUntil: &until,
			Swaps: []swaps.Swap{{At: at(85), Host: "host-a", Plugin: "tickets", Action: swaps.Swapped, From: "3.0.0", To: "3.1.0",
				Cause: swaps.CauseReload, SHA256: strings.Repeat("cd", 32)}}},
	}
	const token = "golden-admin-token-0123456789"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token || r.URL.Path != "/plugins" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	addr := strings.TrimPrefix(srv.URL, "http://")

	for name, args := range map[string][]string{
		"plugins-list":      {"plugins", "list", "--admin-addr", addr, "--admin-token-file", tokenFile},
		"plugins-list.json": {"plugins", "list", "--json", "--admin-addr", addr, "--admin-token-file", tokenFile},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout bytes.Buffer
			cl := &cli{stdout: &stdout, stderr: os.Stderr, now: func() time.Time { return at(90) }}
			require.NoError(t, cl.run(context.Background(), args))
			golden(t, name, stdout.String())
		})
	}
}
