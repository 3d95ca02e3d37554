package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// peerResult is one object of `peers --json` (bench/README.md's schema).
type peerResult struct {
	Runtime    string  `json:"runtime"`
	Inflight   int     `json:"inflight"`
	Jobs       int     `json:"jobs"`
	Seconds    float64 `json:"seconds"`
	JobsPerSec float64 `json:"jobs_per_sec"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Lost       int64   `json:"lost"`
	Doubled    int64   `json:"doubled"`
	Notes      string  `json:"notes"`
}

// runPeers runs `go run ./cmd/peers --json` in cfg.BenchDir on the same
// workload, within what is left of ctx's deadline. Its progress goes to
// stderr; results it printed are returned even when it failed.
func runPeers(ctx context.Context, cfg config, stderr io.Writer) ([]peerResult, error) {
	levels := make([]string, len(cfg.Inflight))
	for i, n := range cfg.Inflight {
		levels[i] = strconv.Itoa(n)
	}
	args := []string{"run", "./cmd/peers", "--json", "--jobs", strconv.Itoa(cfg.Jobs), "--events", strconv.Itoa(cfg.Events),
		"--inflight", strings.Join(levels, ","), "--database-url", cfg.AdminURL, "--redis-url", cfg.RedisURL}
	var res []peerResult
	err := runPeerCommand(ctx, cfg, args, stderr, &res)
	return res, err
}

// runPeerCommand runs go with args in cfg.BenchDir, bounded by what is
// left of ctx's deadline (passed on as --timeout), and decodes its stdout's
// JSON into out, even when it failed.
func runPeerCommand(ctx context.Context, cfg config, args []string, stderr io.Writer, out any) error {
	if dl, ok := ctx.Deadline(); ok {
		// Leave peers time to stop and print before this command's bound.
		left := time.Until(dl) - 10*time.Second
		if left <= 0 {
			return fmt.Errorf("peers: no time left (--timeout)")
		}
		args = append(args, "--timeout", left.Round(time.Second).String())
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = cfg.BenchDir
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, stderr
	runErr := cmd.Run()
	if buf.Len() > 0 {
		if err := json.Unmarshal(buf.Bytes(), out); err != nil {
			return fmt.Errorf("peers: reading its JSON: %w (run error: %v)", err, runErr)
		}
	}
	if runErr != nil {
		return fmt.Errorf("peers (go %s in %s): %w", strings.Join(args, " "), cfg.BenchDir, runErr)
	}
	return nil
}

// ratio is usher's throughput over a peer's at one in-flight level.
type ratio struct {
	Peer     string  `json:"peer"`
	Inflight int     `json:"inflight"`
	Usher    float64 `json:"usher_jobs_per_sec"`
	Other    float64 `json:"peer_jobs_per_sec"`
	Ratio    float64 `json:"ratio"` // usher ÷ peer
}

func ratios(usher []levelResult, peers []peerResult) []ratio {
	var out []ratio
	for _, p := range peers {
		for _, u := range usher {
			if u.Inflight == p.Inflight && u.JobsPerSec > 0 && p.JobsPerSec > 0 {
				out = append(out, ratio{Peer: p.Runtime, Inflight: p.Inflight, Usher: u.JobsPerSec, Other: p.JobsPerSec, Ratio: u.JobsPerSec / p.JobsPerSec})
			}
		}
	}
	return out
}

// bestRatio is usher's best throughput over a peer's best, each runtime at
// the in-flight level where it was fastest in this run: the comparison
// issue 29's targets are stated in (5 x River, 3 x asynq).
type bestRatio struct {
	Peer          string  `json:"peer"`
	UsherInflight int     `json:"usher_inflight"`
	Usher         float64 `json:"usher_jobs_per_sec"`
	PeerInflight  int     `json:"peer_inflight"`
	Other         float64 `json:"peer_jobs_per_sec"`
	Ratio         float64 `json:"ratio"` // usher ÷ peer
}

// bestRatios has one bestRatio per peer runtime, in the peers' order.
func bestRatios(usher []levelResult, peers []peerResult) []bestRatio {
	var u levelResult
	for _, l := range usher {
		if l.JobsPerSec > u.JobsPerSec {
			u = l
		}
	}
	if u.JobsPerSec <= 0 {
		return nil
	}
	var out []bestRatio
	for _, p := range peers {
		if p.JobsPerSec <= 0 {
			continue
		}
		i := slices.IndexFunc(out, func(b bestRatio) bool { return b.Peer == p.Runtime })
		if i < 0 {
			out = append(out, bestRatio{Peer: p.Runtime, UsherInflight: u.Inflight, Usher: u.JobsPerSec})
			i = len(out) - 1
		}
		if p.JobsPerSec > out[i].Other {
			out[i].PeerInflight, out[i].Other, out[i].Ratio = p.Inflight, p.JobsPerSec, u.JobsPerSec/p.JobsPerSec
		}
	}
	return out
}
