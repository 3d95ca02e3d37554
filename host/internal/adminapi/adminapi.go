// Package adminapi is the host's admin HTTP server as a service: the
// metrics, health, plugin report, reload and rollback endpoints and the web
// console, behind admin.Guard (Host and Origin checked on every request,
// the token required on all but /healthz and the console, which asks for
// it on its login form). It reaches the plugins only through the small
// Fleet interface and owns no job's path.
package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/admin"
	"github.com/usherhq/usher/host/console"
	"github.com/usherhq/usher/host/internal/fleet"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/workflow"
)

// Fleet is what the admin API asks of the plugin fleet.
type Fleet interface {
	PluginReport(ctx context.Context) []fleet.PluginStatus
	Reload(ctx context.Context, name string) ([]fleet.ReloadResult, error)
	Rollback(ctx context.Context, name string) (fleet.ReloadResult, error)
}

// Config configures a Server. Every field is required unless it says
// otherwise.
type Config struct {
	// Addr is where to listen (":0" picks a port: Addr reports it).
	Addr string
	// Token is the admin token; TokenFile where it came from (logged).
	Token, TokenFile string
	// AllowedHosts: see host.Config.AdminAllowedHosts. Optional.
	AllowedHosts []string
	Registry     *prometheus.Registry
	Fleet        Fleet
	// Pool, Redis, Stream and Group are what the console reads.
	Pool          *pgxpool.Pool
	Redis         redis.UniversalClient
	Stream, Group string
	// Shards are the stream's shards the host reads; /healthz reaches
	// the primary of each. Default: Stream alone.
	Shards []string
	// ChartWindow and ChartBucket: see host.Config. Optional.
	ChartWindow, ChartBucket time.Duration
	// HistoryRetention is the host's (the console says when a chart's
	// range goes back further). Optional.
	HistoryRetention time.Duration
	// MigrateWorkflows moves running workflows to the version serving
	// their type (host.Host.MigrateWorkflows). Optional: without it
	// POST /workflows/migrate answers 404.
	MigrateWorkflows func(context.Context, workflow.MigrateRequest) (workflow.MigrateResult, error)
	Logger           *slog.Logger
}

// Server is the admin API.
type Server struct {
	cfg Config
	// ln is bound by New: a port that is taken is New's error, before
	// the host says it is ready; Run serves on it.
	ln   net.Listener
	mu   sync.Mutex
	addr string
}

// New validates cfg and binds the listener.
func New(cfg Config) (*Server, error) {
	if cfg.Addr == "" || cfg.Token == "" || cfg.Registry == nil || cfg.Fleet == nil || cfg.Pool == nil || cfg.Redis == nil || cfg.Logger == nil {
		return nil, errors.New("adminapi: needs Addr, Token, Registry, Fleet, Pool, Redis and Logger")
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	return &Server{cfg: cfg, ln: ln}, nil
}

// Close releases the listener of a Server that never ran.
func (s *Server) Close() { _ = s.ln.Close() }

// Addr is the address the server listens on while Run runs; empty before.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run serves on the listener New bound until ctx is done, then closes the
// server.
func (s *Server) Run(ctx context.Context, started func()) error {
	ln := s.ln
	handler, err := s.handler(ln.Addr().String())
	if err != nil {
		_ = ln.Close()
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	bound := ln.Addr().String()
	s.mu.Lock()
	s.addr = bound
	s.mu.Unlock()
	s.cfg.Logger.Info("admin listening", "addr", bound, "token_file", s.cfg.TokenFile)
	if !admin.IsLoopback(bound) {
		s.cfg.Logger.Warn("the admin API listens on a non-loopback address: its token is the only protection, "+
			"and plain HTTP carries it in clear; keep it on 127.0.0.1 or terminate TLS in front of it",
			"addr", bound)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	started()
	select {
	case <-ctx.Done():
		_ = srv.Close()
		<-served
		return nil
	case err := <-served:
		return fmt.Errorf("admin server: %w", err)
	}
}

func (s *Server) handler(bound string) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", s.serveHealth)
	mux.HandleFunc("GET /plugins", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.cfg.Fleet.PluginReport(r.Context()))
	})
	mux.HandleFunc("POST /plugins/reload", s.serveReload)
	mux.HandleFunc("POST /plugins/rollback", s.serveRollback)
	mux.HandleFunc("GET /kinds/paused", s.servePaused)
	mux.HandleFunc("POST /kinds/pause", s.servePause)
	mux.HandleFunc("POST /kinds/resume", s.servePause)
	mux.HandleFunc("POST /jobs/cancel", s.serveJobAction)
	mux.HandleFunc("POST /jobs/run-now", s.serveJobAction)
	mux.HandleFunc("POST /deadletters/discard", s.serveJobAction)
	mux.HandleFunc("POST /deadletters/requeue", s.serveJobAction)
	if s.cfg.MigrateWorkflows != nil {
		mux.HandleFunc("POST /workflows/migrate", s.serveMigrate)
	}
	c, err := console.New(console.Config{
		Pool: s.cfg.Pool, Redis: s.cfg.Redis, Stream: s.cfg.Stream, Group: s.cfg.Group,
		Token: s.cfg.Token, ChartWindow: s.cfg.ChartWindow, ChartBucket: s.cfg.ChartBucket,
		HistoryRetention: s.cfg.HistoryRetention,
		Plugins:          s.consolePlugins, Reload: s.consoleReload, Rollback: s.consoleRollback, Logger: s.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	mux.Handle(console.Prefix, c.Handler())
	handler, err := admin.Guard(admin.GuardConfig{Token: s.cfg.Token, ListenAddr: s.cfg.Addr, BoundAddr: bound,
		AllowedHosts: s.cfg.AllowedHosts, OpenPaths: []string{"/healthz"}, SelfAuthPrefixes: []string{console.Prefix},
		Logger: s.cfg.Logger}, mux)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	return handler, nil
}

// ReloadResponse is the admin API's answer to POST /plugins/reload and
// /plugins/rollback.
type ReloadResponse struct {
	Results []fleet.ReloadResult `json:"results"`
	Error   string               `json:"error,omitempty"`
}

// serveReload is POST /plugins/reload?name=NAME: Reload, answered with a
// ReloadResponse (422 when the reload could not run).
func (s *Server) serveReload(w http.ResponseWriter, r *http.Request) {
	// A swap, once asked for, completes even if the caller hangs up.
	res, err := s.cfg.Fleet.Reload(context.WithoutCancel(r.Context()), r.URL.Query().Get("name"))
	writeReload(w, ReloadResponse{Results: res}, err)
}

// serveRollback is POST /plugins/rollback?name=NAME: Rollback, answered
// with a ReloadResponse of one result (422 when it could not roll back).
func (s *Server) serveRollback(w http.ResponseWriter, r *http.Request) {
	var resp ReloadResponse
	var res fleet.ReloadResult
	err := errors.New("host: name the plugin to roll back (?name=NAME)")
	if name := r.URL.Query().Get("name"); name != "" {
		ctx := context.WithoutCancel(r.Context())
		res, err = s.cfg.Fleet.Rollback(ctx, name)
		if err == nil {
			err = jobctl.Record(ctx, s.cfg.Pool, actorOf(r), jobctl.ActionRollback, name, fmt.Sprintf("%s → %s", res.From, res.To))
		}
	}
	if res.Action != "" {
		resp.Results = []fleet.ReloadResult{res}
	}
	writeReload(w, resp, err)
}

// serveMigrate moves running workflows to the version serving their type:
// the body is a workflow.MigrateRequest, the answer its MigrateResult, or
// {"error": ...} with 422.
func (s *Server) serveMigrate(w http.ResponseWriter, r *http.Request) {
	var req workflow.MigrateRequest
	var res workflow.MigrateResult
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err != nil {
		err = fmt.Errorf("host: a migration request is JSON {\"type\", \"from\", \"ids\", \"limit\"}: %w", err)
	} else {
		res, err = s.cfg.MigrateWorkflows(context.WithoutCancel(r.Context()), req)
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(res)
}

func writeReload(w http.ResponseWriter, resp ReloadResponse, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		resp.Error = err.Error()
		w.WriteHeader(http.StatusUnprocessableEntity)
	}
	_ = json.NewEncoder(w).Encode(resp)
}

func (s *Server) consolePlugins(ctx context.Context) []console.Plugin {
	var out []console.Plugin
	for _, p := range s.cfg.Fleet.PluginReport(ctx) {
		cp := console.Plugin{Name: p.Name, Version: p.Version, Manifest: p.Manifest, SHA256: p.SHA256, Pid: p.Pid,
			Healthy: p.Healthy, Restarts: p.Restarts, Parked: p.Parked, ParkedNow: p.ParkedNow, InFlight: p.InFlight, Swaps: p.Swaps, Previous: p.Previous,
			ProbationUntil: p.ProbationUntil, Refused: p.Refused, RefusedReason: p.RefusedReason}
		for _, k := range p.Kinds {
			// "kind (guard)", as PluginStatus reports it.
			pk := console.PluginKind{Kind: k}
			if i := strings.LastIndex(k, " ("); i > 0 && strings.HasSuffix(k, ")") {
				pk = console.PluginKind{Kind: k[:i], Guard: k[i+2 : len(k)-1]}
			}
			cp.Kinds = append(cp.Kinds, pk)
		}
		if r := p.LastRollback; r != nil {
			cp.LastRollback = fmt.Sprintf("%s → %s at %s (%s: %s)", r.From, r.To, r.At.UTC().Format("2006-01-02 15:04:05Z"), r.Cause, r.Reason)
		}
		out = append(out, cp)
	}
	return out
}

func (s *Server) consoleRollback(ctx context.Context, name string) (console.ReloadResult, error) {
	r, err := s.cfg.Fleet.Rollback(ctx, name)
	return console.ReloadResult{Plugin: r.Plugin, Action: r.Action, From: r.From, To: r.To, Error: r.Error}, err
}

func (s *Server) consoleReload(ctx context.Context, name string) ([]console.ReloadResult, error) {
	res, err := s.cfg.Fleet.Reload(ctx, name)
	out := make([]console.ReloadResult, 0, len(res))
	for _, r := range res {
		out = append(out, console.ReloadResult{Plugin: r.Plugin, Action: r.Action, From: r.From, To: r.To, Error: r.Error})
	}
	return out, err
}

// PauseResponse is the admin API's answer to POST /kinds/pause and
// /kinds/resume: Changed is false when the kind already was as asked.
type PauseResponse struct {
	Kind    string        `json:"kind"`
	Paused  bool          `json:"paused"`
	Changed bool          `json:"changed"`
	Pause   *pause.Paused `json:"pause,omitempty"`
	Error   string        `json:"error,omitempty"`
}

// servePause is POST /kinds/pause?kind=KIND[&reason=WHY][&by=WHO] and
// POST /kinds/resume?kind=KIND[&by=WHO]: the action is recorded as by (or
// "admin API") via the admin API from the caller's address.
func (s *Server) servePause(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	resp := PauseResponse{Kind: q.Get("kind")}
	actor := actorOf(r)
	ctx := context.WithoutCancel(r.Context())
	var err error
	if strings.HasSuffix(r.URL.Path, "/pause") {
		var p pause.Paused
		p, resp.Changed, err = pause.Pause(ctx, s.cfg.Pool, resp.Kind, actor, q.Get("reason"))
		resp.Paused, resp.Pause = err == nil, &p
	} else {
		resp.Changed, err = pause.Resume(ctx, s.cfg.Pool, resp.Kind, actor)
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		resp.Error, resp.Pause = err.Error(), nil
		w.WriteHeader(http.StatusUnprocessableEntity)
	}
	_ = json.NewEncoder(w).Encode(resp)
}

// servePaused is GET /kinds/paused: the paused kinds (pause.List).
func (s *Server) servePaused(w http.ResponseWriter, r *http.Request) {
	list, err := pause.List(r.Context(), s.cfg.Pool)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if list == nil {
		list = []pause.Paused{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// actorOf is who acts through the admin API, as operator_actions records
// it: ?by=WHO (default "admin API") and the caller's address.
func actorOf(r *http.Request) string {
	by := strings.TrimSpace(r.URL.Query().Get("by"))
	if by == "" {
		by = "admin API"
	}
	return fmt.Sprintf("%.200s via the admin API from %s", by, r.RemoteAddr)
}

// JobActionResponse is the admin API's answer to POST /jobs/cancel,
// /jobs/run-now, /deadletters/discard and /deadletters/requeue: what was
// done (Message, as the CLI prints it), or Error with 422.
type JobActionResponse struct {
	// Jobs are the jobs acted on.
	Jobs    []string `json:"jobs,omitempty"`
	Message string   `json:"message,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// serveJobAction is POST /jobs/cancel?id=JOB[&reason=WHY],
// /jobs/run-now?id=JOB, /deadletters/discard?id=LETTER[&reason=WHY] and
// /deadletters/requeue?id=LETTER[&id=LETTER...] (all or none), each
// with [&by=WHO]: host/jobctl's actions, recorded as by via the admin API
// from the caller's address.
func (s *Server) serveJobAction(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ctx := context.WithoutCancel(r.Context())
	actor := actorOf(r)
	var resp JobActionResponse
	var err error
	switch r.URL.Path {
	case "/jobs/cancel":
		var c jobctl.Cancelled
		c, err = jobctl.Cancel(ctx, s.cfg.Pool, q.Get("id"), actor, q.Get("reason"))
		resp.Jobs, resp.Message = []string{c.JobID}, c.String()
	case "/jobs/run-now":
		var was time.Time
		was, err = jobctl.RunNow(ctx, s.cfg.Pool, q.Get("id"), actor)
		resp.Jobs, resp.Message = []string{q.Get("id")}, fmt.Sprintf("job %s is due now (was due %s)", q.Get("id"), was.UTC().Format(time.RFC3339))
	case "/deadletters/discard":
		var ids []int64
		if ids, err = jobctl.ParseIDs(q["id"]); err == nil && len(ids) != 1 {
			err = errors.New("host: discard takes one dead letter (?id=ID)")
		}
		if err == nil {
			var job string
			job, err = jobctl.Discard(ctx, s.cfg.Pool, ids[0], actor, q.Get("reason"))
			resp.Jobs, resp.Message = []string{job}, fmt.Sprintf("discarded dead letter %d of job %s: kept in its history, no longer open", ids[0], job)
		}
	default: // /deadletters/requeue
		var ids []int64
		if ids, err = jobctl.ParseIDs(q["id"]); err == nil {
			resp.Jobs, err = jobctl.Requeue(ctx, s.cfg.Pool, ids, actor)
			resp.Message = fmt.Sprintf("requeued %d dead letter(s) through the outbox, identities kept", len(resp.Jobs))
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		resp = JobActionResponse{Error: err.Error()}
		w.WriteHeader(http.StatusUnprocessableEntity)
	}
	_ = json.NewEncoder(w).Encode(resp)
}
