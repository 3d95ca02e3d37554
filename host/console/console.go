package console

import (
	"context"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// Plugin is a loaded plugin as the plugins page shows it (the host's
// PluginStatus, converted by the host).
type Plugin struct {
	Name, Version string
	// Manifest and SHA256 are the manifest file and the checksum verified
	// before the plugin started; empty for a plugin not from a manifest.
	Manifest, SHA256 string
	Pid              int
	Healthy          bool
	Restarts         int
	Parked           int64
	Kinds            []string
	// Previous is the version a rollback would go back to;
	// ProbationUntil, while set, when the running version stops being
	// judged for an automatic rollback.
	Previous       string
	ProbationUntil *time.Time
	// LastRollback describes the last rollback, "" when none.
	LastRollback string
	// Refused is the manifest version last refused and why.
	Refused, RefusedReason string
}

// ReloadResult is what a reload did to one plugin.
type ReloadResult struct {
	Plugin, Action, From, To, Error string
}

// Config configures a Console.
type Config struct {
	// Pool and Redis are the runtime's; Stream and Group its stream and
	// consumer group. Required.
	Pool   *pgxpool.Pool
	Redis  redis.UniversalClient
	Stream string
	Group  string
	// Token is the admin token the login form asks for. Required.
	Token string
	// Metrics is the host's registry, sampled every SampleInterval for
	// the overview's charts. Required.
	Metrics prometheus.Gatherer
	// Plugins and Reload are the host's (the admin API's /plugins and
	// /plugins/reload). Required.
	Plugins func() []Plugin
	Reload  func(ctx context.Context, name string) ([]ReloadResult, error)
	// SampleInterval is how often the counters are sampled. Default 10s.
	SampleInterval time.Duration
	// Samples is how many samples are kept (the charts' width in time is
	// Samples × SampleInterval). Default 360 (an hour at 10s).
	Samples int
	// SessionTTL is how long a login lasts. Default 12h.
	SessionTTL time.Duration
	// Logger logs logins and actions. Required.
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	switch {
	case c.Pool == nil || c.Redis == nil:
		return errors.New("console: Pool and Redis are required")
	case c.Stream == "" || c.Group == "":
		return errors.New("console: Stream and Group are required")
	case c.Token == "":
		return errors.New("console: Token is required")
	case c.Metrics == nil:
		return errors.New("console: Metrics is required")
	case c.Plugins == nil || c.Reload == nil:
		return errors.New("console: Plugins and Reload are required")
	case c.Logger == nil:
		return errors.New("console: Logger is required")
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = 10 * time.Second
	}
	if c.Samples <= 0 {
		c.Samples = 360
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = 12 * time.Hour
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Console serves the console's pages and keeps its samples.
type Console struct {
	cfg      Config
	log      *slog.Logger
	tokenSum [sha256.Size]byte
	sessions *sessions
	samples  *sampler
	pages    map[string]*template.Template
	mux      *http.ServeMux
}

// New builds a Console. Serve it under Prefix (Handler) and run its
// sampler (Run) while the host runs.
func New(cfg Config) (*Console, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: cfg.Logger, tokenSum: sha256.Sum256([]byte(cfg.Token)),
		sessions: newSessions(cfg.SessionTTL, cfg.Now), samples: newSampler(cfg.Metrics, cfg.Samples, cfg.Now)}
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

// Run samples the counters every SampleInterval until ctx is done.
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.SampleInterval)
	defer t.Stop()
	for {
		if err := c.samples.sample(); err != nil {
			c.log.Warn("console: sample the metrics", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Handler is the console, to be served under Prefix behind the admin
// guard's Host and Origin checks.
func (c *Console) Handler() http.Handler { return c.mux }

func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		if n == "templates/layout.html" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[n[len("templates/"):]] = t
	}
	return pages, nil
}
