package host

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/sandbox"
)

// DefaultPluginPoolSize is PluginPoolSize's default.
const DefaultPluginPoolSize = 4

// ConnectionBudget is the most Postgres connections one host holds: its
// own pool's hostPool, and pluginPool for each of plugins plugins. N hosts
// hold N times that; the server's max_connections, less its
// superuser_reserved_connections and whatever else connects to it (the
// applications), must cover them (docs/operating.md, "Connection budget").
func ConnectionBudget(hostPool, plugins, pluginPool int) int { return hostPool + plugins*pluginPool }

// newHostPool opens the host's own pool on DatabaseURL, its sessions
// bounded like the plugins' (sandbox.Bound): TCP keepalives and
// IdleInTransactionTimeout.
func newHostPool(ctx context.Context, c Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, err
	}
	sandbox.Bound(&pc.ConnConfig.Config, sandbox.SessionLimits{IdleInTransaction: c.IdleInTransactionTimeout})
	return pgxpool.NewWithConfig(ctx, pc)
}

// postgresError says why the host could not reach Postgres: a server out
// of connection slots (SQLSTATE 53300) is told apart from one that does
// not answer.
func postgresError(err error) error {
	if msg, full := sandbox.TooManyConnections(err); full {
		return wrapped{fmt.Sprintf("host: postgres refused the connection: no connection slot left (%s, SQLSTATE 53300): the hosts, their plugins' pools and the applications hold the server's max_connections; see docs/operating.md, \"Connection budget\" for what each host holds (host pool + each plugin's pool, logged at start as max_connections)", msg), err}
	}
	return fmt.Errorf("host: cannot connect to postgres: %w", err)
}

// wrapped is an error that says msg and wraps err (whose own text msg
// already tells).
type wrapped struct {
	msg string
	err error
}

func (w wrapped) Error() string { return w.msg }
func (w wrapped) Unwrap() error { return w.err }
