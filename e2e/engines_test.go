package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// The bounds the engine fault tests state (docs/scaling.md "Engine
// failures" repeats them with what was measured).
const (
	// engineFlagBound: a quota crossed just after a node of an engine
	// cluster is killed -9 is flagged in Redis within this. It covers the
	// engine's own failover (a Kafka partition leader moves once the
	// controller fences the dead broker, broker.session.timeout.ms 9 s; a
	// Redis Cluster replica is promoted after cluster-node-timeout 2 s)
	// plus the clients' retries.
	engineFlagBound = 45 * time.Second
	// engineResume: ingest acknowledges again within this after a Kafka
	// broker's kill -9 (the load retries what is refused meanwhile).
	engineResume = 30 * time.Second
	// replicaCatchUp: a ClickHouse replica started again holds every row
	// its peer stored while it was down within this.
	replicaCatchUp = 60 * time.Second
)

// engineTenants are fault tenants of prefix plus a second limited tenant.
func engineTenants(prefix string) (load []string, limited, limited2 string) {
	load, limited = faultTenants(prefix)
	return load, limited, limited + "-2"
}

// waitAcked waits until the loader has acknowledged one more batch than
// when it was called and returns when that happened.
func (l *loader) waitAcked(t testing.TB, within time.Duration) time.Duration {
	t.Helper()
	start, n := time.Now(), l.ackedCount()
	itest.Eventually(t, within, "ingest acknowledges again", func() bool { return l.ackedCount() > n })
	return time.Since(start)
}

// rowsAndDistinct returns usage_events' physical rows and distinct ids of
// tenants on one server.
func rowsAndDistinct(conn driver.Conn, tenants []string) (rows, distinct uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = conn.QueryRow(ctx, "SELECT count(), uniqExact(tenant, id) FROM usage_events WHERE has(?, tenant)", tenants).Scan(&rows, &distinct)
	return rows, distinct, err
}

// openOne connects to the server addr of cluster cfg alone.
func openOne(t testing.TB, cfg chconn.Config, addr string) driver.Conn {
	t.Helper()
	one := cfg
	one.Addrs, one.Addr = nil, addr
	conn, err := chconn.Open(context.Background(), one)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestFaultClickHouseReplicaKill runs the pipeline on the services
// script's two ClickHouse 18.16 replicas (clickhouse.cluster,
// clickhouse.addrs) and kills -9 the replica every connection prefers
// under load. Enforcement does not wait for it (a quota crossed then is
// flagged within engineFlagBound); the aggregator's inserts move to the
// other replica; when the killed one is started again it catches up
// within replicaCatchUp; afterwards every acknowledged event is stored
// once — as rows, on both replicas, not only as distinct ids — and the
// counters equal the ground truth.
func TestFaultClickHouseReplicaKill(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	itest.LockEngine(t, itest.EngineClickHouse, true)
	cfg := itest.ClickHouseCluster(t)
	load, limited := faultTenants("e2e-chrep")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000}), ClickHouse: &cfg})
	s.startAll("ingest", "aggregator", "enforcer")
	l := startLoader(t, s, 50, 20*time.Millisecond, load...)
	l.waitProgress(t, 1000)

	tenants := append(append([]string(nil), load...), limited)
	survivor := openOne(t, cfg, cfg.Addrs[1])
	first, _ := strconv.Atoi(cfg.Addrs[0][strings.LastIndex(cfg.Addrs[0], ":")+1:])
	itest.KillEngineNode(t, itest.EngineClickHouse, first)
	killed := time.Now()
	atKill, _, err := rowsAndDistinct(survivor, tenants)
	if err != nil {
		t.Fatal(err)
	}
	pushOver(t, s, limited)
	s.waitQuotaFlag(t, limited, engineFlagBound)
	flagged := time.Since(killed)
	l.waitProgress(t, 1000)
	// The aggregator's inserts moved to the surviving replica. (What the
	// killed one stored before the survivor fetched it waits for its
	// return: insert_quorum 0, see docs/scaling.md.)
	itest.EventuallyNoError(t, waitTimeout, "the aggregator stores on the surviving replica", func() error {
		n, _, err := rowsAndDistinct(survivor, tenants)
		if err != nil {
			return err
		}
		if n < atKill+1000 {
			return fmt.Errorf("%d rows, %d at the kill", n, atKill)
		}
		return nil
	})
	stored := time.Since(killed)

	restartTook := itest.RestartEngine(t, itest.EngineClickHouse)
	back := time.Now()
	l.waitProgress(t, 500)
	l.stop()
	final := l.snapshot()
	conns := make([]driver.Conn, 0, len(cfg.Addrs))
	for _, a := range cfg.Addrs {
		conns = append(conns, openOne(t, cfg, a))
	}
	var want uint64
	for _, m := range final {
		want += uint64(len(m))
	}
	want++ // the limited tenant's event
	itest.EventuallyNoError(t, replicaCatchUp, "both replicas hold every acknowledged event once, as rows", func() error {
		for i, c := range conns {
			rows, distinct, err := rowsAndDistinct(c, tenants)
			if err != nil {
				return err
			}
			if rows != want || distinct != want {
				return fmt.Errorf("replica %s: %d rows, %d distinct, want %d of each", cfg.Addrs[i], rows, distinct, want)
			}
		}
		return nil
	})
	caughtUp := time.Since(back)
	s.countersMatchTruth(t, final)
	s.requireAlive()
	t.Logf("replica %s killed: quota flagged after %v, 1,000 more rows stored on the survivor after %v; the replica restarted in %v and caught up %v after; %d events",
		cfg.Addrs[0], flagged.Round(time.Millisecond), stored.Round(time.Millisecond), restartTook.Round(time.Millisecond), caughtUp.Round(time.Millisecond), want)
}

// TestFaultKafkaBrokerKill runs ingest, the aggregator and the enforcer
// on the services script's three KRaft brokers, topics at replication
// factor 3 (min.insync.replicas 2, acks=all), and kills -9 under load
// first the broker leading most of the usage topic's partitions, then —
// once it is back — the active controller. Each time ingest acknowledges
// again within engineResume, a quota crossed just after the kill is
// flagged within engineFlagBound, and in the end every acknowledged event
// is stored and counted once.
func TestFaultKafkaBrokerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	itest.LockEngine(t, itest.EngineKafka, true)
	kc := itest.KafkaCluster(t)
	load, limited, limited2 := engineTenants("e2e-kbrk")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000, limited2: 1000}),
		KafkaBrokers: strings.Join(kc.Brokers, ","), KafkaReplicationFactor: 3,
		Extra: []string{"-services.ingest.produce_timeout=5s"}})
	s.startAll("ingest", "aggregator", "enforcer")
	l := startLoader(t, s, 50, 20*time.Millisecond, load...)
	l.waitProgress(t, 1000)

	cl, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()

	// The broker leading most of the usage topic's partitions.
	md, err := adm.Metadata(ctx, s.topic)
	if err != nil {
		t.Fatal(err)
	}
	leads := map[int32]int{}
	for _, p := range md.Topics[s.topic].Partitions {
		if len(p.Replicas) != 3 {
			t.Fatalf("usage topic partition %d has replicas %v, want 3", p.Partition, p.Replicas)
		}
		leads[p.Leader]++
	}
	leader, most := int32(-1), 0
	for id, n := range leads {
		if n > most {
			leader, most = id, n
		}
	}
	step := func(what string, node int32, tenant string) {
		port := brokerPort(t, md, node)
		itest.KillEngineNode(t, itest.EngineKafka, port)
		killed := time.Now()
		resumed := l.waitAcked(t, engineResume)
		pushOver(t, s, tenant)
		s.waitQuotaFlag(t, tenant, engineFlagBound)
		flagged := time.Since(killed)
		l.waitProgress(t, 500)
		restart := itest.RestartEngine(t, itest.EngineKafka)
		t.Logf("%s (node %d, port %d) killed: ingest acknowledged again after %v, a quota crossed then flagged after %v; restarted in %v",
			what, node, port, resumed.Round(time.Millisecond), flagged.Round(time.Millisecond), restart.Round(time.Millisecond))
	}
	step(fmt.Sprintf("leader of %d of %d usage partitions", most, len(md.Topics[s.topic].Partitions)), leader, limited)
	l.waitProgress(t, 500)
	step("the active controller", activeController(t, cl), limited2)

	l.stop()
	s.countersMatchTruth(t, l.snapshot())
	s.countersMatchTruthTokens(t, limited, 1200)
	s.countersMatchTruthTokens(t, limited2, 1200)
	s.requireAlive()
	t.Logf("%d events acknowledged, %d batches refused and retried", l.ackedCount(), l.refused)
}

// brokerPort is the client port of node.
func brokerPort(t testing.TB, md kadm.Metadata, node int32) int {
	t.Helper()
	for _, d := range md.Brokers {
		if d.NodeID == node {
			return int(d.Port)
		}
	}
	t.Fatalf("broker %d not in the metadata", node)
	return 0
}

// activeController asks the quorum (DescribeQuorum, through a broker) for
// the leader of the metadata log: the active controller, which on these
// combined nodes is a broker too.
func activeController(t testing.TB, cl *kgo.Client) int32 {
	t.Helper()
	req := kmsg.NewPtrDescribeQuorumRequest()
	topic := kmsg.NewDescribeQuorumRequestTopic()
	topic.Topic = "__cluster_metadata"
	part := kmsg.NewDescribeQuorumRequestTopicPartition()
	part.Partition = 0
	topic.Partitions = append(topic.Partitions, part)
	req.Topics = append(req.Topics, topic)
	var leader int32 = -1
	itest.EventuallyNoError(t, waitTimeout, "the quorum names its leader", func() error {
		resp, err := req.RequestWith(context.Background(), cl)
		if err != nil {
			return err
		}
		if len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
			return fmt.Errorf("empty DescribeQuorum answer (code %d)", resp.ErrorCode)
		}
		p := resp.Topics[0].Partitions[0]
		if p.LeaderID < 0 {
			return fmt.Errorf("no leader (code %d)", p.ErrorCode)
		}
		leader = p.LeaderID
		return nil
	})
	return leader
}

// TestFaultRedisMasterKill puts the flags on the services script's Redis
// Cluster with a replica per master and kills -9 the master holding a
// tenant's flags under load, right after that tenant crossed its quota
// (another tenant's flag, raised before, sits on whichever master). The
// replica takes over (cluster-node-timeout 2 s) and within engineFlagBound
// the crossed tenant is flagged and the earlier flag is still (or again)
// there; the counters stay exact.
func TestFaultRedisMasterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	itest.LockEngine(t, itest.EngineRedisHA, true)
	load, limited, limited2 := engineTenants("e2e-rmaster")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000, limited2: 1000}), RedisHA: true})
	s.startAll("ingest", "aggregator", "enforcer")
	l := startLoader(t, s, 50, 20*time.Millisecond, load...)
	l.waitProgress(t, 1000)
	pushOver(t, s, limited)
	s.waitQuotaFlag(t, limited, waitTimeout)

	ctx := context.Background()
	cc := s.rdb.(*redis.ClusterClient)
	key := flags.Layout{Prefix: s.prefix}.TenantKey(limited2)
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatalf("the master of %s: %v", key, err)
	}
	master := node.Options().Addr
	_, port, _ := net.SplitHostPort(master)
	p, _ := strconv.Atoi(port)
	pushOver(t, s, limited2)
	itest.KillEngineNode(t, itest.EngineRedisHA, p)
	killed := time.Now()
	s.waitQuotaFlag(t, limited2, engineFlagBound)
	flagged := time.Since(killed)
	s.waitQuotaFlag(t, limited, engineFlagBound-time.Since(killed))
	l.waitProgress(t, 500)
	rejoin := itest.RestartEngine(t, itest.EngineRedisHA)
	l.stop()
	s.countersMatchTruth(t, l.snapshot())
	s.requireAlive()
	t.Logf("master %s (of %s) killed: %s flagged after %v, %s's flag kept; the node rejoined as a replica in %v",
		master, limited2, limited2, flagged.Round(time.Millisecond), limited, rejoin.Round(time.Millisecond))
}
