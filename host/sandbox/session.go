package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sessions the host opens.
//
// Every session the host opens (its own pool's and each plugin's) is
// bounded by the server as well as by the host, so that a host that stops
// answering (SIGSTOP, a machine gone, a network cut) does not hold its
// locks for ever:
//
//   - idle_in_transaction_session_timeout: the server ends a session that
//     sits inside a transaction sending nothing for longer than that, and
//     its locks go with it. It must exceed the longest a host's own
//     transaction waits between two statements, a job's run (JobTimeout),
//     or a slow job of a live host is cut too.
//   - TCP keepalives on both ends (the server's tcp_keepalives_* settings
//     and the client's dialer): a peer that vanished is found in about
//     KeepaliveIdle + KeepaliveCount*KeepaliveInterval. A stopped process
//     still answers keepalives (its kernel does), which is why the
//     timeout above is the one that frees a frozen host's locks.
//   - lock_timeout (plugin sessions): a plugin statement waiting on a row
//     lock gives up after that instead of waiting on another session's
//     transaction for as long as it lasts.
//
// All are given at login, so RESET and DISCARD ALL come back to them.

// Keepalive settings of every session the host opens.
const (
	KeepaliveIdle     = 30 * time.Second
	KeepaliveInterval = 10 * time.Second
	KeepaliveCount    = 3
)

// SessionLimits are the server-side bounds of a session the host opens.
type SessionLimits struct {
	// IdleInTransaction is idle_in_transaction_session_timeout. Zero:
	// not set (the server's default, usually none).
	IdleInTransaction time.Duration
	// Lock is lock_timeout. Zero: not set.
	Lock time.Duration
}

// Bound sets limits and the TCP keepalives (server and client side) on cc,
// a connection configuration the host logs in with. Settings cc already
// carries in its RuntimeParams (from the URL's options) are kept, but for
// the ones limits sets.
func Bound(cc *pgconn.Config, limits SessionLimits) {
	cc.RuntimeParams = maps.Clone(cc.RuntimeParams)
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if limits.IdleInTransaction > 0 {
		cc.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(limits.IdleInTransaction.Milliseconds())
	}
	if limits.Lock > 0 {
		cc.RuntimeParams["lock_timeout"] = fmt.Sprint(limits.Lock.Milliseconds())
	}
	for k, v := range map[string]string{
		"tcp_keepalives_idle":     fmt.Sprint(int(KeepaliveIdle.Seconds())),
		"tcp_keepalives_interval": fmt.Sprint(int(KeepaliveInterval.Seconds())),
		"tcp_keepalives_count":    fmt.Sprint(KeepaliveCount),
	} {
		if _, set := cc.RuntimeParams[k]; !set {
			cc.RuntimeParams[k] = v
		}
	}
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: KeepaliveIdle, Interval: KeepaliveInterval, Count: KeepaliveCount}}
	cc.DialFunc = d.DialContext
}

// TooManyConnections reports whether err is the server refusing a session
// for want of connection slots (SQLSTATE 53300: max_connections reached,
// "remaining connection slots are reserved", or a role's CONNECTION
// LIMIT), and returns the server's message.
func TooManyConnections(err error) (string, bool) {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "53300" {
		return pg.Message, true
	}
	return "", false
}

// LogsInWithoutPassword reports whether the server lets role log in with
// no password from where base connects (trust authentication, on the
// host's machine): then a plugin running there can open sessions of its
// own, outside the host's transactions, deadlines and pools, whatever the
// host does. base is the host's own connection configuration; only its
// server, database and TLS settings are used.
func LogsInWithoutPassword(ctx context.Context, base *pgx.ConnConfig, role string) (bool, error) {
	cc := base.Copy()
	cc.User, cc.Password = role, ""
	cc.ValidateConnect, cc.AfterConnect = nil, nil
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cc)
	if err == nil {
		_ = c.Close(ctx)
		return true, nil
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && strings.HasPrefix(pg.Code, "28") { // invalid authorization, password failed
		return false, nil
	}
	return false, err
}
