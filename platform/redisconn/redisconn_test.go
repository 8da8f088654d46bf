package redisconn_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// TestTLSWithACLUser: a client built from redis.tls and an ACL user with a
// password_file writes and reads over the services script's TLS port, as
// that user.
func TestTLSWithACLUser(t *testing.T) {
	rc := itest.RedisTLS(t)
	if err := rc.Validate(); err != nil {
		t.Fatalf("Validate() = %v for the services script's TLS settings", err)
	}
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := redisconn.Ready(cl)(ctx); err != nil {
		t.Fatal(err)
	}
	key := itest.Unique(t, "sluice_test:")
	if err := cl.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	if got, err := cl.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Fatalf("GET over TLS = %q, %v; want v", got, err)
	}
	if who, err := cl.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != rc.Username {
		t.Fatalf("ACL WHOAMI = %q, %v; want %s", who, err, rc.Username)
	}
}

// TestTLSPortWithoutTLSFails: a plaintext client on the TLS port fails, and
// the readiness error says TLS is the likely cause rather than only "EOF".
func TestTLSPortWithoutTLSFails(t *testing.T) {
	rc := itest.RedisTLS(t)
	rc.TLS.Enabled = false
	rc.TLS.CAFile = ""
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := redisconn.Ready(cl)(ctx)
	if err == nil || !strings.Contains(err.Error(), "redis.tls.enabled") {
		t.Fatalf("Ready() without TLS on the TLS port = %v, want an error naming redis.tls.enabled", err)
	}
}

// TestTLSWrongPasswordFails: the ACL user with a wrong password is refused,
// and the password is not in the error.
func TestTLSWrongPasswordFails(t *testing.T) {
	rc := itest.RedisTLS(t)
	rc.PasswordFile = filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(rc.PasswordFile, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := redisconn.Ready(cl)(ctx)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("Ready() with a wrong password = %v, want WRONGPASS", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// TestValidateNamesSetting: credential and TLS mistakes stop start-up
// naming the setting, and a client built anyway fails every command with
// that error instead of falling back to plaintext.
func TestValidateNamesSetting(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*redisconn.Config)
		want string
	}{
		"user without password":  {func(c *redisconn.Config) { c.Username = "sluice" }, "redis.password"},
		"missing password file":  {func(c *redisconn.Config) { c.PasswordFile = "/nonexistent/pw" }, "redis.password_file"},
		"both password and file": {func(c *redisconn.Config) { c.Password, c.PasswordFile = "s3cret", "/etc/hostname" }, "redis.password and redis.password_file"},
		"tls without enabled":    {func(c *redisconn.Config) { c.TLS.ServerName = "redis" }, "redis.tls.enabled"},
		"missing ca file": {func(c *redisconn.Config) {
			c.TLS.Enabled = true
			c.TLS.CAFile = "/nonexistent/ca.pem"
		}, "redis.tls.ca_file"},
		"cert without key": {func(c *redisconn.Config) {
			c.TLS.Enabled = true
			c.TLS.CertFile = "/etc/hostname"
		}, "redis.tls.key_file"},
	} {
		t.Run(name, func(t *testing.T) {
			c := redisconn.Defaults()
			tc.mut(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to name %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
			cl := redisconn.NewClient(c)
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := cl.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ping with an invalid configuration = %v, want the error naming %s", err, tc.want)
			}
		})
	}
}

// TestPasswordNeverPrinted: the password set through the environment
// reaches the client but not fmt or slog output of the configuration.
func TestPasswordNeverPrinted(t *testing.T) {
	var cfg struct {
		Redis redisconn.Config `yaml:"redis"`
	}
	cfg.Redis = redisconn.Defaults()
	env := map[string]string{"SLUICE_REDIS_USERNAME": "sluice", "SLUICE_REDIS_PASSWORD": "s3cret"}
	err := config.Load(&cfg, config.Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Password.Reveal() != "s3cret" {
		t.Fatalf("password from SLUICE_REDIS_PASSWORD = %q", cfg.Redis.Password.Reveal())
	}
	cl := redisconn.NewClient(cfg.Redis)
	defer cl.Close()
	if cl.(*redis.Client).Options().Password != "s3cret" {
		t.Fatal("the client did not get the password")
	}
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Info("config", "redis", cfg.Redis)
	for _, out := range []string{fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), b.String()} {
		if strings.Contains(out, "s3cret") {
			t.Errorf("the password is printed: %s", out)
		}
	}
}

// TestClusterClientUsesEveryMaster: with redis.cluster the client follows
// the real cluster's slot map: keys in every slot are written and read
// back, and every master ends up holding some of them.
func TestClusterClientUsesEveryMaster(t *testing.T) {
	rc := itest.RedisCluster(t)
	if err := rc.Validate(); err != nil {
		t.Fatalf("Validate() = %v for the services script's cluster", err)
	}
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	cc, ok := cl.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient with cluster=true returned %T, want *redis.ClusterClient", cl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := redisconn.Ready(cl)(ctx); err != nil {
		t.Fatal(err)
	}
	prefix := itest.Unique(t, "sluice_test:")
	const n = 60
	for i := range n {
		if err := cl.Set(ctx, fmt.Sprintf("%s:{%d}", prefix, i), i, time.Minute).Err(); err != nil {
			t.Fatalf("SET key %d: %v", i, err)
		}
	}
	for i := range n {
		if v, err := cl.Get(ctx, fmt.Sprintf("%s:{%d}", prefix, i)).Int(); err != nil || v != i {
			t.Fatalf("GET key %d = %d, %v", i, v, err)
		}
	}
	var mu sync.Mutex
	perMaster := map[string]int{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		keys, err := node.Keys(ctx, prefix+":*").Result()
		mu.Lock()
		perMaster[node.Options().Addr] = len(keys)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for addr, k := range perMaster {
		if k == 0 {
			t.Errorf("master %s holds none of the %d keys: %v", addr, n, perMaster)
		}
		total += k
	}
	if len(perMaster) != 3 || total != n {
		t.Fatalf("keys per master %v: want 3 masters holding %d keys in all", perMaster, n)
	}
}

// TestReadyNamesMismatchedMode: a cluster client aimed at a single Redis,
// and a single-server client aimed at a cluster node, are not ready, and
// the error says which setting to change.
func TestReadyNamesMismatchedMode(t *testing.T) {
	single, cluster := itest.Redis(t), itest.RedisCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	wrongCluster := single
	wrongCluster.Cluster = true
	cl := redisconn.NewClient(wrongCluster)
	defer cl.Close()
	if err := redisconn.Ready(cl)(ctx); err == nil || !strings.Contains(err.Error(), "unset redis.cluster") {
		t.Errorf("Ready() of a cluster client on a single Redis = %v, want an error saying to unset redis.cluster", err)
	}

	wrongSingle := cluster
	wrongSingle.Cluster, wrongSingle.Addrs = false, nil
	cl2 := redisconn.NewClient(wrongSingle)
	defer cl2.Close()
	if err := redisconn.Ready(cl2)(ctx); err == nil || !strings.Contains(err.Error(), "set redis.cluster=true") {
		t.Errorf("Ready() of a single-server client on a cluster node = %v, want an error saying to set redis.cluster=true", err)
	}
}

// TestValidateCluster: the cluster settings' mistakes are named.
func TestValidateCluster(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*redisconn.Config)
		want string // "" = valid
	}{
		"cluster with seeds":            {func(c *redisconn.Config) { c.Cluster, c.Addrs = true, []string{"10.0.0.1:6379", "10.0.0.2:6379"} }, ""},
		"cluster with addr as the seed": {func(c *redisconn.Config) { c.Cluster = true }, ""},
		"addrs without cluster":         {func(c *redisconn.Config) { c.Addrs = []string{"10.0.0.1:6379"} }, "redis.addrs: 1 seed nodes given without redis.cluster=true"},
		"bad seed":                      {func(c *redisconn.Config) { c.Cluster, c.Addrs = true, []string{"10.0.0.1:6379", "10.0.0.2"} }, `redis.addrs[1]: "10.0.0.2" is not host:port`},
		"bad addr as the seed":          {func(c *redisconn.Config) { c.Cluster, c.Addr = true, "redis" }, "redis.addr: \"redis\" is not host:port (redis.cluster=true"},
		"db on a cluster":               {func(c *redisconn.Config) { c.Cluster, c.DB = true, 2 }, "redis.db: 2, but a Redis Cluster has only database 0"},
	} {
		t.Run(name, func(t *testing.T) {
			c := redisconn.Defaults()
			tc.mut(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestClusterFromEnvironment: SLUICE_REDIS_CLUSTER and SLUICE_REDIS_ADDRS
// (a comma-separated list) make a cluster client of the seed nodes.
func TestClusterFromEnvironment(t *testing.T) {
	var cfg struct {
		Redis redisconn.Config `yaml:"redis"`
	}
	cfg.Redis = redisconn.Defaults()
	env := map[string]string{"SLUICE_REDIS_CLUSTER": "true", "SLUICE_REDIS_ADDRS": "10.0.0.1:6379, 10.0.0.2:6379"}
	if err := config.Load(&cfg, config.Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Redis.Validate(); err != nil {
		t.Fatal(err)
	}
	cl := redisconn.NewClient(cfg.Redis)
	defer cl.Close()
	cc, ok := cl.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient = %T, want *redis.ClusterClient", cl)
	}
	if got := cc.Options().Addrs; strings.Join(got, ",") != "10.0.0.1:6379,10.0.0.2:6379" {
		t.Fatalf("seed nodes %v", got)
	}
}

// TestContextTimeoutsReachBothClientKinds: admission (and anything else
// promising a latency bound) needs ContextTimeoutEnabled on the client;
// the option sets it for a single Redis and for a Cluster, and clients
// made without it keep go-redis's default.
func TestContextTimeoutsReachBothClientKinds(t *testing.T) {
	single := redisconn.Defaults()
	cluster := redisconn.Defaults()
	cluster.Cluster, cluster.Addrs = true, []string{"127.0.0.1:1"}
	for _, c := range []redisconn.Config{single, cluster} {
		for _, want := range []bool{false, true} {
			var opts []redisconn.ClientOption
			if want {
				opts = append(opts, redisconn.ContextTimeouts())
			}
			cl := redisconn.NewClient(c, opts...)
			var got bool
			switch cl := cl.(type) {
			case *redis.Client:
				got = cl.Options().ContextTimeoutEnabled
			case *redis.ClusterClient:
				got = cl.Options().ContextTimeoutEnabled
			}
			cl.Close()
			if got != want {
				t.Errorf("cluster=%v, ContextTimeouts given %v: the %T has ContextTimeoutEnabled=%v", c.Cluster, want, cl, got)
			}
		}
	}
}

// TestEveryKindTakesTheSettings: a single Redis, a Cluster and a primary
// found through Sentinels each get the user, password, timeouts and pool
// size of the configuration (and the database, but for a Cluster, which
// has none).
func TestEveryKindTakesTheSettings(t *testing.T) {
	base := redisconn.Defaults()
	base.Username, base.Password, base.DB, base.PoolSize, base.DialTimeout = "sluice", "s3cret", 2, 7, 3*time.Second
	cluster := base
	cluster.Cluster, cluster.DB, cluster.Addrs = true, 0, []string{"127.0.0.1:1", "127.0.0.1:2"}
	sentinel := base
	sentinel.Sentinel = redisconn.Sentinel{Master: "mymaster", Addrs: []string{"127.0.0.1:3"}, Password: "sent"}
	type got struct {
		user, pass      string
		db, pool        int
		dial, read, wri time.Duration
	}
	want := got{"sluice", "s3cret", 2, 7, 3 * time.Second, time.Second, time.Second}
	for _, c := range []redisconn.Config{base, cluster, sentinel} {
		cl := redisconn.NewClient(c)
		var g got
		switch cl := cl.(type) {
		case *redis.Client:
			o := cl.Options()
			g = got{o.Username, o.Password, o.DB, o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout}
		case *redis.ClusterClient:
			o := cl.Options()
			g = got{o.Username, o.Password, 2, o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout}
			if strings.Join(o.Addrs, ",") != "127.0.0.1:1,127.0.0.1:2" || o.ClusterStateReloadInterval != 10*time.Second {
				t.Errorf("cluster: seeds %v, slot map reloaded every %v", o.Addrs, o.ClusterStateReloadInterval)
			}
		}
		cl.Close()
		if g != want {
			t.Errorf("cluster=%v sentinel=%v: the %T has %+v, want %+v", c.Cluster, c.Sentinel.Enabled(), cl, g, want)
		}
	}
}
