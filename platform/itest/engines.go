package itest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// The engine clusters of scripts/services.sh (docs/scaling.md): two
// replicated ClickHouse servers with ZooKeeper, three Kafka brokers, a
// Redis Cluster with a replica per master, a Redis primary and replica
// under Sentinels. Fault tests kill -9 a node of them and bring it back
// with the script (RestartEngine), so every test that uses an engine
// cluster holds its lock (LockEngine): shared for a test that only uses
// it, exclusive for one that breaks a node, across every test process.

// The names of the engine clusters, as the services script knows them.
const (
	EngineClickHouse    = "clickhouse-cluster"
	EngineKafka         = "kafka-cluster"
	EngineRedisHA       = "redis-ha"
	EngineRedisSentinel = "redis-sentinel"
)

// Cluster names in deploy/clickhouse/cluster.xml.
const (
	ClickHouseReplicatedCluster = "sluice_replicated"
	ClickHouseShardedCluster    = "sluice_sharded"
)

// LockEngine holds the lock of an engine cluster until t ends: shared
// (exclusive false) while a test only uses it, exclusive while a fault
// test kills one of its nodes, so nothing else meets the cluster short of
// a node. The lock is a file lock in the system's temporary folder, held
// by every test process alike (go test runs packages as processes).
func LockEngine(t testing.TB, engine string, exclusive bool) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "sluice-itest-"+engine+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("lock %s: %v", engine, err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	start := time.Now()
	// flock blocks the thread; a fault test holds the lock for a minute or
	// two, well within any test's timeout.
	runtime.LockOSThread()
	err = syscall.Flock(int(f.Fd()), how)
	runtime.UnlockOSThread()
	if err != nil {
		f.Close()
		t.Fatalf("lock %s: %v", engine, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %v for the %s lock", waited.Round(time.Millisecond), engine)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}

func addrs(env, def string) []string { return strings.Split(addr(env, def), ",") }

func requireAll(t testing.TB, service string, hostports []string) {
	t.Helper()
	for _, a := range hostports {
		Require(t, service, a)
	}
}

// ClickHouseCluster returns the configuration of a database of this test
// on the services script's replicated ClickHouse cluster (one shard, two
// replicas: clickhouse.cluster=sluice_replicated, clickhouse.addrs both
// servers), created on both and dropped from both when t ends. The caller
// holds the engine lock (LockEngine) first.
func ClickHouseCluster(t testing.TB) chconn.Config {
	t.Helper()
	c := clusterServers()
	c.Cluster = ClickHouseReplicatedCluster
	return clusterDatabase(t, c)
}

// ClickHouseSharded is ClickHouseCluster on the same two servers as two
// shards of one replica each (clickhouse.sharded; the replication path
// names the servers' sharded_shard macro).
func ClickHouseSharded(t testing.TB) chconn.Config {
	t.Helper()
	c := clusterServers()
	c.Cluster = ClickHouseShardedCluster
	c.Sharded = true
	c.ReplicationPath = "/clickhouse/tables/{sharded_shard}/{database}/{table}"
	return clusterDatabase(t, c)
}

// clusterServers is the default configuration on the services script's
// two ClickHouse cluster servers.
func clusterServers() chconn.Config {
	c := chconn.Defaults()
	c.Addrs = addrs("SLUICE_CLICKHOUSE_CLUSTER_ADDRS", "127.0.0.1:19201,127.0.0.1:19202")
	c.Addr = c.Addrs[0]
	return c
}

// clusterDatabase gives c, on the cluster's servers, a database of the
// test's own (testDatabase).
func clusterDatabase(t testing.TB, c chconn.Config) chconn.Config {
	t.Helper()
	requireAll(t, EngineClickHouse, c.Addrs)
	return testDatabase(t, c)
}

// KafkaCluster returns the configuration of the services script's three
// brokers, for topics at replication factor 3 (min.insync.replicas 2).
func KafkaCluster(t testing.TB) kafkaconn.Config {
	t.Helper()
	brokers := addrs("SLUICE_KAFKA_CLUSTER_BROKERS", "127.0.0.1:19101,127.0.0.1:19102,127.0.0.1:19103")
	requireAll(t, EngineKafka, brokers)
	return testKafka(brokers, 3)
}

// RedisHA returns the configuration of the services script's Redis
// Cluster with a replica per master (six nodes, all seeds).
func RedisHA(t testing.TB) redisconn.Config {
	t.Helper()
	c := redisconn.Defaults()
	c.Addrs = addrs("SLUICE_REDIS_HA_ADDRS", "127.0.0.1:17101,127.0.0.1:17102,127.0.0.1:17103,127.0.0.1:17104,127.0.0.1:17105,127.0.0.1:17106")
	c.Addr = c.Addrs[0]
	c.Cluster = true
	requireAll(t, EngineRedisHA, c.Addrs)
	return c
}

// RedisSentinel returns the configuration of the services script's Redis
// primary under three Sentinels (redis.sentinel).
func RedisSentinel(t testing.TB) redisconn.Config {
	t.Helper()
	c := redisconn.Defaults()
	c.Sentinel.Addrs = addrs("SLUICE_ITEST_REDIS_SENTINEL_ADDRS", "127.0.0.1:26479,127.0.0.1:26480,127.0.0.1:26481")
	c.Sentinel.Master = addr("SLUICE_ITEST_REDIS_SENTINEL_MASTER", "sluice")
	requireAll(t, EngineRedisSentinel, c.Sentinel.Addrs)
	return c
}

// ServicesDir is the services script's folder: SLUICE_SERVICES_DIR, or
// .services at the module's root.
func ServicesDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("SLUICE_SERVICES_DIR"); d != "" {
		return d
	}
	return filepath.Join(moduleRoot(t), ".services")
}

func moduleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// EnginePid returns the pid of the node of engine on port, from the
// services script's pid file.
func EnginePid(t testing.TB, engine string, port int) int {
	t.Helper()
	f := filepath.Join(ServicesDir(t), "run", fmt.Sprintf("%s-%d.pid", engine, port))
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatalf("pid of %s node %d: %v", engine, port, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %s: %v", f, err)
	}
	return pid
}

// KillEngineNode kills -9 the node of engine on port and waits until the
// process is gone. The caller holds the engine's lock exclusively and
// calls RestartEngine (a t.Cleanup does too, so a failing test leaves the
// cluster whole).
func KillEngineNode(t testing.TB, engine string, port int) {
	t.Helper()
	pid := EnginePid(t, engine, port)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s node %d (pid %d): %v", engine, port, pid, err)
	}
	EventuallyNoError(t, time.Minute, fmt.Sprintf("%s node %d (pid %d) gone", engine, port, pid), func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("alive")
		}
		return nil
	})
	t.Cleanup(func() { RestartEngine(t, engine) })
}

// RestartEngine runs `scripts/services.sh up engine`, which starts the
// nodes of engine that are not running and waits until the cluster is
// whole again, and returns how long that took.
func RestartEngine(t testing.TB, engine string) time.Duration {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(filepath.Join(moduleRoot(t), "scripts", "services.sh"), "up", engine)
	cmd.Env = append(os.Environ(), "SLUICE_SERVICES_DIR="+ServicesDir(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/services.sh up %s: %v\n%s", engine, err, out)
	}
	return time.Since(start)
}
