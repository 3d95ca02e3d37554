package host

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis Cluster URL schemes: redis-cluster://[user:pass@]host:port[,host:port...][?options]
// (rediss-cluster:// for TLS). The addresses are seeds: any node of the
// cluster will do, the client learns the slot map from it and follows
// MOVED/ASK on its own. Options are go-redis's (ParseClusterURL's).
const (
	clusterScheme    = "redis-cluster"
	clusterTLSScheme = "rediss-cluster"
)

// ClusterStateReload is how often a cluster client re-reads the slot map
// even when no command was redirected: after a primary dies, the replica
// promoted in its place is found within this long (a MOVED or a network
// error reloads it at once). go-redis's default is 60 s.
const ClusterStateReload = 2 * time.Second

// IsClusterURL says whether redisURL names a Redis Cluster.
func IsClusterURL(redisURL string) bool {
	return strings.HasPrefix(redisURL, clusterScheme+"://") || strings.HasPrefix(redisURL, clusterTLSScheme+"://")
}

// NewRedisClient builds the client for redisURL: a cluster client for a
// redis-cluster:// (rediss-cluster://) URL, else a single-node one
// (RedisOptions). Both are a redis.UniversalClient, and every key the
// runtime uses together is in one hash slot (the stream's hash tag), so
// the same code serves both.
func NewRedisClient(redisURL, caFile string) (redis.UniversalClient, error) {
	if !IsClusterURL(redisURL) {
		opt, err := RedisOptions(redisURL, caFile)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(opt), nil
	}
	opt, err := ClusterOptions(redisURL, caFile)
	if err != nil {
		return nil, err
	}
	return redis.NewClusterClient(opt), nil
}

// ClusterOptions parses a redis-cluster:// URL (see NewRedisClient).
func ClusterOptions(redisURL, caFile string) (*redis.ClusterOptions, error) {
	scheme, rest, _ := strings.Cut(redisURL, "://")
	tlsOn := scheme == clusterTLSScheme
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo := ""
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	addrs := strings.Split(authority, ",")
	for _, a := range addrs {
		if a == "" {
			return nil, fmt.Errorf("redis url: %s has an empty address", maskURL(redisURL))
		}
	}
	// go-redis's form: the first address in the authority, the others as
	// addr= options.
	base := "redis"
	if tlsOn {
		base = "rediss"
	}
	path, query, _ := strings.Cut(tail, "?")
	if path != "" && path != "/" {
		return nil, fmt.Errorf("redis url: a cluster has no database number (%q)", path)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	opt, err := redis.ParseClusterURL(base + "://" + userinfo + addrs[0] + "?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if opt.ClusterStateReloadInterval == 0 {
		opt.ClusterStateReloadInterval = ClusterStateReload
	}
	if caFile != "" {
		if !tlsOn {
			return nil, fmt.Errorf("a Redis CA file (%s) is set but the Redis URL is not rediss-cluster:// (TLS)", caFile)
		}
		roots, err := caPool(caFile)
		if err != nil {
			return nil, err
		}
		if opt.TLSConfig == nil {
			opt.TLSConfig = &tls.Config{}
		}
		opt.TLSConfig.RootCAs = roots
	}
	return opt, nil
}
