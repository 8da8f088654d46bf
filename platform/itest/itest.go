// Package itest gives integration tests the real backing services started by
// scripts/services.sh (Kafka, ClickHouse, Redis, the Redis Cluster,
// Alertmanager), each isolated
// per test: a fresh topic name, a fresh ClickHouse database, a fresh Redis
// key prefix.
//
// A service that cannot be reached skips the test on a developer's machine
// but FAILS it when CI=true, so CI can never pass by skipping: `make test`
// starts the services first, and a missing one is a broken build.
package itest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// Addresses default to the services script's ports; the SLUICE_* variables
// printed by `scripts/services.sh env` override them.
func addr(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// Require checks that hostport accepts connections, and otherwise skips the
// test (fails under CI=true) with a message saying how to start it.
func Require(t testing.TB, service, hostport string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostport, 2*time.Second)
	if err == nil {
		c.Close()
		return
	}
	msg := fmt.Sprintf("%s is not reachable at %s (%v); start it with `scripts/services.sh up %s`", service, hostport, err, service)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Unique returns prefix plus the test's name and a random suffix, usable as
// a topic, database or key prefix: only [a-z0-9_] characters.
func Unique(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.ToLower(nonWord.ReplaceAllString(t.Name(), "_"))
	if len(name) > 40 {
		name = name[:40]
	}
	return prefix + name + "_" + hex.EncodeToString(b[:])
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

// Topics returns usage, signals and admin topics of the test's own, so that
// no test reads another's records or a deployment's (the root topics
// section, as a service's platform.Env carries it).
func Topics(t testing.TB) platform.Topics {
	t.Helper()
	return platform.Topics{Usage: Unique(t, "usage_"), Signals: Unique(t, "signals_"), Admin: Unique(t, "admin_")}
}

// Kafka returns the configuration of the real broker.
func Kafka(t testing.TB) kafkaconn.Config {
	t.Helper()
	brokers := addrs("SLUICE_KAFKA_BROKERS", "127.0.0.1:19092")
	Require(t, "kafka", brokers[0])
	return testKafka(brokers, 1)
}

// testKafka is the tests' configuration of brokers: topics they create
// have 3 partitions of rf replicas.
func testKafka(brokers []string, rf int16) kafkaconn.Config {
	c := kafkaconn.Defaults()
	c.Brokers, c.ClientID = brokers, "sluice-test"
	c.Partitions, c.ReplicationFactor = 3, rf
	return c
}

// ClickHouse returns a configuration whose database was created for this
// test and is dropped when it ends (kept when SLUICE_KEEP_TEST_DB=1, for
// looking at a failure).
func ClickHouse(t testing.TB) chconn.Config {
	t.Helper()
	c := chconn.Defaults()
	c.Addr = addr("SLUICE_CLICKHOUSE_ADDR", c.Addr)
	Require(t, "clickhouse", c.Addr)
	return testDatabase(t, c)
}

// testDatabase gives c a database of the test's own, created now and
// dropped from each of c's servers when t ends (kept when
// SLUICE_KEEP_TEST_DB=1, for looking at a failure).
func testDatabase(t testing.TB, c chconn.Config) chconn.Config {
	t.Helper()
	c.Database = Unique(t, "t_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := chconn.EnsureDatabase(ctx, c); err != nil {
		t.Fatal(err)
	}
	servers := c.Servers()
	t.Cleanup(func() {
		if os.Getenv("SLUICE_KEEP_TEST_DB") == "1" {
			t.Logf("keeping ClickHouse database %s", c.Database)
			return
		}
		// A benchmark's database can hold tens of millions of rows in
		// thousands of parts; dropping it took longer than 30 s once.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for _, a := range servers {
			one := c
			one.Addrs, one.Addr = nil, a
			conn, err := chconn.Open(ctx, one)
			if err != nil {
				t.Logf("drop test database %s on %s: %v", c.Database, a, err)
				continue
			}
			if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+c.Database); err != nil {
				t.Logf("drop test database %s on %s: %v", c.Database, a, err)
			}
			conn.Close()
		}
	})
	return c
}

// Redis returns the configuration of the real Redis. Tests isolate
// themselves by key prefix (see Unique), not by database number.
func Redis(t testing.TB) redisconn.Config {
	t.Helper()
	c := redisconn.Defaults()
	c.Addr = addr("SLUICE_REDIS_ADDR", c.Addr)
	c.KeyPrefix = Unique(t, "sluice_test:") + ":"
	Require(t, "redis", c.Addr)
	return c
}

// DropKeysAtEnd deletes every key of rdb under prefix when t ends: keys
// that expire late (a month's counters) or never would otherwise pile up
// in the shared Redis, test run after test run.
func DropKeysAtEnd(t testing.TB, rdb redis.UniversalClient, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		for _, k := range rdb.Keys(ctx, prefix+"*").Val() {
			rdb.Del(ctx, k)
		}
	})
}

// ScratchRedis connects to the real Redis and returns the client and a key
// prefix of t's own: the client closes and every key under the prefix is
// dropped when t ends, so tests sharing the one Redis never see each
// other's keys nor leave theirs behind.
func ScratchRedis(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	rdb := redisconn.NewClient(Redis(t))
	t.Cleanup(func() { rdb.Close() })
	prefix := Unique(t, "sluice:test:")
	DropKeysAtEnd(t, rdb, prefix)
	return rdb, prefix
}

// RedisCluster returns the configuration of the real 3-master Redis Cluster
// (`scripts/services.sh up redis-cluster`, SLUICE_REDIS_CLUSTER_ADDRS).
// Tests isolate themselves by key prefix, as with Redis; keys that must
// share a slot carry a hash tag.
func RedisCluster(t testing.TB) redisconn.Config {
	t.Helper()
	c := redisconn.Defaults()
	c.Addrs = strings.Split(addr("SLUICE_REDIS_CLUSTER_ADDRS", "127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003"), ",")
	c.Addr = c.Addrs[0]
	c.Cluster = true
	c.KeyPrefix = Unique(t, "sluice_test:") + ":"
	for _, a := range c.Addrs {
		Require(t, "redis-cluster", a)
	}
	return c
}

// Alertmanager returns the base URL of the real Alertmanager.
func Alertmanager(t testing.TB) string {
	t.Helper()
	u := addr("SLUICE_ALERTMANAGER_URL", "http://127.0.0.1:19093")
	Require(t, "alertmanager", strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"))
	return u
}
