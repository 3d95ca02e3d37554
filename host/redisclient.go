package host

import (
	"crypto/tls"
	"errors"
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

// clusterURL is a redis-cluster:// URL cut in parts: net/url refuses its
// list of addresses. userinfo keeps its "@".
type clusterURL struct {
	scheme, userinfo, hosts, tail string
}

func splitClusterURL(s string) clusterURL {
	var c clusterURL
	var rest string
	c.scheme, rest, _ = strings.Cut(s, "://")
	c.hosts = rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		c.hosts, c.tail = rest[:i], rest[i:]
	}
	if i := strings.LastIndex(c.hosts, "@"); i >= 0 {
		c.userinfo, c.hosts = c.hosts[:i+1], c.hosts[i+1:]
	}
	return c
}

// user is the URL's user info (nil without one).
func (c clusterURL) user() *url.Userinfo {
	if c.userinfo == "" {
		return nil
	}
	u, err := url.Parse("redis://" + c.userinfo + "h")
	if err != nil {
		return nil
	}
	return u.User
}

func (c clusterURL) String() string { return c.scheme + "://" + c.userinfo + c.hosts + c.tail }

// RedisURLWithPassword is redisURL (either form NewRedisClient takes)
// with password pw for its user ("default" when it names none); an error
// when it already holds a password.
func RedisURLWithPassword(redisURL, pw string) (string, error) {
	var c clusterURL
	var u *url.URL
	var user *url.Userinfo
	if IsClusterURL(redisURL) {
		c = splitClusterURL(redisURL)
		user = c.user()
	} else {
		var err error
		if u, err = url.Parse(redisURL); err != nil {
			return "", fmt.Errorf("redis url: %w", err)
		}
		user = u.User
	}
	if _, has := user.Password(); has {
		return "", errors.New("the Redis URL holds a password and --redis-password-file gives one: use one")
	}
	name := "default"
	if user != nil && user.Username() != "" {
		name = user.Username()
	}
	if u != nil {
		u.User = url.UserPassword(name, pw)
		return u.String(), nil
	}
	c.userinfo = url.UserPassword(name, pw).String() + "@"
	return c.String(), nil
}

// maskClusterURL is a cluster URL with its password, if any, masked.
func maskClusterURL(s string) string {
	c := splitClusterURL(s)
	if user := c.user(); user != nil {
		if _, has := user.Password(); has {
			c.userinfo = url.UserPassword(user.Username(), "xxxxx").String() + "@"
		}
	}
	return c.String()
}

// ClusterOptions parses a redis-cluster:// URL (see NewRedisClient).
func ClusterOptions(redisURL, caFile string) (*redis.ClusterOptions, error) {
	c := splitClusterURL(redisURL)
	tlsOn := c.scheme == clusterTLSScheme
	userinfo, tail := c.userinfo, c.tail
	addrs := strings.Split(c.hosts, ",")
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
