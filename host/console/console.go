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
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/swaps"
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
	// Parked counts deliveries parked since the host started; ParkedNow
	// the entries waiting parked now (fleet.PluginStatus).
	Parked, ParkedNow int64
	// InFlight is its jobs running on this host now.
	InFlight int64
	Kinds    []PluginKind
	// Previous is the version a rollback would go back to;
	// ProbationUntil, while set, when the running version stops being
	// judged for an automatic rollback.
	Previous       string
	ProbationUntil *time.Time
	// LastRollback describes the last rollback, "" when none.
	LastRollback string
	// Refused is the manifest version last refused and why.
	Refused, RefusedReason string
	// Swaps are its last swaps, rollbacks and refusals on any host,
	// newest first.
	Swaps []swaps.Swap
}

// PluginKind is a kind a plugin serves, with its guard.
type PluginKind struct{ Kind, Guard string }

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
	// Plugins and Reload are the host's (the admin API's /plugins and
	// /plugins/reload). Required.
	Plugins func(ctx context.Context) []Plugin
	Reload  func(ctx context.Context, name string) ([]ReloadResult, error)
	// Rollback swaps plugin name back to the version its last swap
	// replaced (the admin API's /plugins/rollback). Required.
	Rollback func(ctx context.Context, name string) (ReloadResult, error)
	// ChartWindow is how far back the overview's charts go, and
	// ChartBucket the width of one point: they count the job history's
	// records of every host (ops.Throughput). Defaults 1h and 1m.
	ChartWindow, ChartBucket time.Duration
	// HistoryRetention is how long the job history is kept: the overview
	// says so when a range goes back further (its oldest buckets are
	// empty). 0: not said.
	HistoryRetention time.Duration
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
	case c.Plugins == nil || c.Reload == nil || c.Rollback == nil:
		return errors.New("console: Plugins, Reload and Rollback are required")
	case c.Logger == nil:
		return errors.New("console: Logger is required")
	}
	if c.ChartWindow <= 0 {
		c.ChartWindow = time.Hour
	}
	if c.ChartBucket <= 0 {
		c.ChartBucket = time.Minute
	}
	if c.ChartBucket < time.Millisecond || c.ChartWindow/c.ChartBucket > 2000 {
		return fmt.Errorf("console: a chart of %s in buckets of %s has too many points (at most 2000, a bucket at least 1ms)", c.ChartWindow, c.ChartBucket)
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

// Console serves the console's pages.
type Console struct {
	cfg      Config
	log      *slog.Logger
	tokenSum [sha256.Size]byte
	sessions *sessions
	pages    map[string]*template.Template
	mux      *http.ServeMux
}

// New builds a Console. Serve it under Prefix (Handler).
func New(cfg Config) (*Console, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: cfg.Logger, tokenSum: sha256.Sum256([]byte(cfg.Token)),
		sessions: newSessions(cfg.SessionTTL, cfg.Now)}
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
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
