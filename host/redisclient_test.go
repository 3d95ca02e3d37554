package host_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
)

func TestRedisClusterURLs(t *testing.T) {
	t.Parallel()
	opt, err := host.ClusterOptions("redis-cluster://usher:pw@10.0.0.1:7000,10.0.0.2:7001,10.0.0.3:7002?dial_timeout=2s", "")
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"}, opt.Addrs)
	require.Equal(t, "usher", opt.Username)
	require.Equal(t, "pw", opt.Password)
	require.Equal(t, 2*time.Second, opt.DialTimeout)
	require.Equal(t, host.ClusterStateReload, opt.ClusterStateReloadInterval)
	require.Nil(t, opt.TLSConfig)

	opt, err = host.ClusterOptions("rediss-cluster://10.0.0.1:7000/", "")
	require.NoError(t, err)
	require.NotNil(t, opt.TLSConfig, "rediss-cluster:// is TLS")
	_, err = host.ClusterOptions("redis-cluster://10.0.0.1:7000/1", "")
	require.ErrorContains(t, err, "no database number")
	_, err = host.ClusterOptions("redis-cluster://10.0.0.1:7000,,10.0.0.2:7000", "")
	require.ErrorContains(t, err, "empty address")
	_, err = host.ClusterOptions("redis-cluster://10.0.0.1:7000", "ca.pem")
	require.ErrorContains(t, err, "not rediss-cluster://")

	c, err := host.NewRedisClient("redis-cluster://127.0.0.1:7000,127.0.0.1:7001", "")
	require.NoError(t, err)
	require.IsType(t, &redis.ClusterClient{}, c)
	_ = c.Close()
	c, err = host.NewRedisClient("redis://127.0.0.1:6379/0", "")
	require.NoError(t, err)
	require.IsType(t, &redis.Client{}, c)
	_ = c.Close()

	require.Equal(t, "redis-cluster://usher:xxxxx@a:1,b:2?x=1", host.MaskURL("redis-cluster://usher:secret@a:1,b:2?x=1"))
	require.Equal(t, "redis-cluster://a:1,b:2", host.MaskURL("redis-cluster://a:1,b:2"))

	u, err := host.RedisURLWithPassword("redis-cluster://usher@a:1,b:2/", "p w")
	require.NoError(t, err)
	require.Equal(t, "redis-cluster://usher:p%20w@a:1,b:2/", u)
	opt, err = host.ClusterOptions(u, "")
	require.NoError(t, err)
	require.Equal(t, "p w", opt.Password)
	u, err = host.RedisURLWithPassword("redis-cluster://a:1,b:2", "pw")
	require.NoError(t, err)
	require.Equal(t, "redis-cluster://default:pw@a:1,b:2", u)
	u, err = host.RedisURLWithPassword("redis://usher@h:6379/0", "pw")
	require.NoError(t, err)
	require.Equal(t, "redis://usher:pw@h:6379/0", u)
	_, err = host.RedisURLWithPassword("redis-cluster://u:old@a:1", "pw")
	require.ErrorContains(t, err, "holds a password")
}
