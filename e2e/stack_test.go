package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// Deadlines of the waits: generous, because the suites share two cores
// with the services and with other packages' tests.
const (
	readyTimeout = 5 * time.Minute
	waitTimeout  = 60 * time.Second
)

// stackOptions chooses the infrastructure a stack runs against; zero
// values mean the shared services of scripts/services.sh.
type stackOptions struct {
	// Policy is the quota policy YAML.
	Policy string
	// KafkaBrokers, ClickHouseAddr and RedisAddr replace the shared
	// services' addresses (a private instance, or a proxy in front of one).
	KafkaBrokers   string
	ClickHouseAddr string
	RedisAddr      string
	// RedisCluster puts the flags on the services script's Redis Cluster
	// (redis.cluster, redis.addrs) instead of the single Redis.
	RedisCluster bool
	// RedisHA puts them on its Redis Cluster with a replica per master.
	RedisHA bool
	// ClickHouse is a database on a ClickHouse cluster
	// (itest.ClickHouseCluster) instead of one on the single server: the
	// migrations are applied in its layout and every service gets its
	// clickhouse.addrs and clickhouse.cluster.
	ClickHouse *chconn.Config
	// KafkaReplicationFactor is kafka.replication_factor for the topics
	// the stack and its services create (0: the shared broker's 1).
	KafkaReplicationFactor int16
	// ScopedTenant is the only tenant the scoped ingest key may report.
	ScopedTenant string
	// Extra flags for every service process.
	Extra []string
}

// stack is one isolated Sluice deployment: its own ClickHouse database,
// usage topic, consumer groups and Redis key prefix, with each service a
// subprocess of the sluice binary.
type stack struct {
	t         testing.TB
	dir       string
	ch        chconn.Config // the shared ClickHouse, database of this stack
	conn      driver.Conn
	kafka     string
	chAddr    string
	redisAddr string
	// redisCluster are the cluster's seed nodes when the flags are on the
	// Redis Cluster (stackOptions.RedisCluster).
	redisCluster []string
	rdb          redis.UniversalClient
	// redisPrefix is the stack's redis.key_prefix; prefix its flags' part
	// (the enforcer's and the Checkers' layout).
	redisPrefix string
	prefix      string
	topic       string
	signals     string // this stack's signals topic
	admin       string // this stack's operator-action topic
	adminAddr   string // the enforcer's admin API
	adminToken  string // a token the admin API accepts
	policyPath  string
	ingestAddr  string
	// ingests are the listen addresses of every ingest replica the loader
	// spreads its batches over (ingestAddr alone unless a test adds more).
	ingests   []string
	ingestKey string // may report any tenant
	scopedKey string // may report opts.ScopedTenant only
	alertmgr  string
	groups    map[string]string
	extra     []string

	mu    sync.Mutex
	procs map[string]*proc
}

// proc is one running service subprocess.
type proc struct {
	name    string // the key of stack.procs: the service, or a replica's name
	service string // what `sluice run` runs
	extra   []string
	cmd     *exec.Cmd
	opsAddr string
	logPath string
	done    chan struct{}
	err     error
}

func newStack(t testing.TB, opts stackOptions) *stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	s := &stack{t: t, dir: t.TempDir(), procs: map[string]*proc{}, extra: opts.Extra}

	if opts.ClickHouse != nil {
		s.ch = *opts.ClickHouse
		if _, err := migrations.ApplyConfig(ctx, s.ch, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		conn, err := chconn.Open(ctx, s.ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		s.conn = conn
	} else {
		s.ch, s.conn = migrationtest.Open(t)
	}
	s.chAddr = orDefault(opts.ClickHouseAddr, s.ch.Addr)

	kc := itest.Kafka(t)
	s.kafka = orDefault(opts.KafkaBrokers, strings.Join(kc.Brokers, ","))
	if opts.KafkaReplicationFactor != 0 {
		kc.ReplicationFactor = opts.KafkaReplicationFactor
		s.extra = append([]string{fmt.Sprintf("-kafka.replication_factor=%d", opts.KafkaReplicationFactor)}, s.extra...)
	}
	if opts.RedisCluster || opts.RedisHA {
		rc := itest.RedisCluster(t)
		if opts.RedisHA {
			rc = itest.RedisHA(t)
		}
		s.redisCluster = rc.Addrs
		s.rdb = redisconn.NewClient(rc)
	} else {
		s.redisAddr = orDefault(opts.RedisAddr, itest.Redis(t).Addr)
		s.rdb = redis.NewClient(&redis.Options{Addr: s.redisAddr, MaxRetries: -1})
	}
	t.Cleanup(func() { s.rdb.Close() })
	s.alertmgr = itest.Alertmanager(t)

	s.redisPrefix = itest.Unique(t, "e2e") + ":"
	s.prefix = s.redisPrefix + redisconn.FlagKeys
	s.topic = itest.Unique(t, "e2e_usage")
	// Its own signals topic too: signals on the shared sluice.signals.v1
	// reach the enforcer and alerter of any deployment on the same broker,
	// which flag and alert for tenants that exist only in a test.
	s.signals = itest.Unique(t, "e2e_signals")
	s.admin = itest.Unique(t, "e2e_admin")
	// Admin tokens are YAML-only settings: every process reads this file.
	s.adminAddr, s.adminToken = freeAddr(t), randomKey()
	cfgYAML := fmt.Sprintf("services:\n  enforcer:\n    admin:\n      tokens:\n        - {name: e2e, sha256: %q}\n", adminapi.HashToken(s.adminToken))
	if err := os.WriteFile(filepath.Join(s.dir, "sluice.yaml"), []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	s.groups = map[string]string{
		"aggregator": itest.Unique(t, "e2e_agg"),
		"enforcer":   itest.Unique(t, "e2e_enf"),
		"alerter":    itest.Unique(t, "e2e_alert"),
	}
	// The topic is created now and the enforcer's and alerter's fresh
	// groups committed at its start, so neither misses a signal the
	// aggregator produces before they join.
	kcfg := kc
	kcfg.Brokers = strings.Split(s.kafka, ",")
	if err := startGroupsAtEnd(ctx, kcfg, s.signals, s.groups["enforcer"], s.groups["alerter"]); err != nil {
		t.Fatal(err)
	}

	s.policyPath = filepath.Join(s.dir, "policy.yaml")
	s.writePolicy(opts.Policy)
	s.ingestKey, s.scopedKey = randomKey(), randomKey()
	scoped := orDefault(opts.ScopedTenant, "scoped-only")
	keys := fmt.Sprintf("keys:\n  - id: e2e-gateway\n    sha256: %s\n    tenants: [\"*\"]\n  - id: e2e-scoped\n    sha256: %s\n    tenants: [%s]\n",
		sha(s.ingestKey), sha(s.scopedKey), scoped)
	if err := os.WriteFile(filepath.Join(s.dir, "keys.yaml"), []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	// The stack runs signed: the aggregator and reconciler sign signals
	// with this key, the enforcer and alerter refuse any they cannot verify.
	if err := os.WriteFile(filepath.Join(s.dir, "signal-keys"), []byte("e2e:"+randomKey()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.ingestAddr = freeAddr(t)
	s.ingests = []string{s.ingestAddr}
	t.Cleanup(s.stopAll)
	return s
}

// startGroupsAtEnd commits, for each fresh group, the topic's end offsets.
func startGroupsAtEnd(ctx context.Context, kc kafkaconn.Config, topic string, groups ...string) error {
	cl, err := kafkaconn.NewClient(kc)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, cl, kc, topic); err != nil {
		return err
	}
	adm := kadm.NewClient(cl)
	ends, err := kafkaconn.EndOffsets(ctx, adm, topic)
	if err != nil {
		return err
	}
	offs := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		offs.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	for _, g := range groups {
		resp, err := adm.CommitOffsets(ctx, g, offs)
		if err != nil {
			return fmt.Errorf("start group %s at the end of %s: %w", g, topic, err)
		}
		if err := resp.Error(); err != nil {
			return fmt.Errorf("start group %s at the end of %s: %w", g, topic, err)
		}
	}
	return nil
}

func (s *stack) writePolicy(yaml string) {
	s.t.Helper()
	// Write and rename, so a hot reload never reads half a file.
	tmp := s.policyPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o600); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.policyPath); err != nil {
		s.t.Fatal(err)
	}
}

// appendConfig adds yaml under the services: section of the stack's
// configuration file (which every process reads): a gateway's section,
// say, which needs lists the flags cannot give.
func (s *stack) appendConfig(yaml string) {
	s.t.Helper()
	path := filepath.Join(s.dir, "sluice.yaml")
	conf, err := os.ReadFile(path)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(path, append(conf, yaml...), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// args are the flags every service process gets.
func (s *stack) args(opsAddr string) []string {
	a := []string{
		"-log.format=text", "-migrate=false",
		"-config=" + filepath.Join(s.dir, "sluice.yaml"),
		"-ops.listen=" + opsAddr,
		"-kafka.brokers=" + s.kafka, "-kafka.partitions=4",
		"-clickhouse.database=" + s.ch.Database,
		"-policy.file=" + s.policyPath, "-policy.reload=500ms",
		"-redis.key_prefix=" + s.redisPrefix,
		"-topics.usage=" + s.topic, "-topics.signals=" + s.signals, "-topics.admin=" + s.admin,
		// Only a gateway or authz process reads it; tests that start one
		// write it first.
		"-tenant_keys.file=" + filepath.Join(s.dir, "gateway-keys.yaml"),
		"-signal_auth.key_file=" + filepath.Join(s.dir, "signal-keys"),
		"-services.ingest.listen=" + s.ingestAddr,
		"-services.ingest.gateway_keys.file=" + filepath.Join(s.dir, "keys.yaml"),
		// The period-reset test stamps events an hour ahead.
		"-services.ingest.max_event_future=2h",
		"-services.aggregator.consumer.group=" + s.groups["aggregator"],
		// The period-reset test stamps events an hour ahead; without this the
		// aggregator holds them (uncounted) until their time comes.
		"-services.aggregator.max_event_future=2h",
		"-services.aggregator.flush_interval=100ms",
		"-services.aggregator.consumer.session_timeout=6s",
		"-services.enforcer.consumer.group=" + s.groups["enforcer"],
		"-services.enforcer.admin.listen=" + s.adminAddr,
		"-services.alerter.consumer.group=" + s.groups["alerter"],
		"-services.alerter.alertmanager.url=" + s.alertmgr,
		"-services.alerter.rules.pending_for=1s",
		"-services.alerter.rules.group_wait=0s",
		"-services.alerter.tick=200ms",
		// The stack runs no gateway service, but its shared defaults must
		// not be left for one to meet another deployment's.
		"-services.gateway.name=" + s.prefix + "gateway",
		"-services.gateway.deferred.topic_prefix=" + s.topic + "_deferred",
		"-services.gateway.deferred.consumer.group=" + s.topic + "_deferred",
		// Nor the forward-auth endpoint's.
		"-services.authz.name=" + s.prefix + "authz",
		// The process's shutdown_timeout covers each service's own (35 s by
		// default); stop kills what outlasts 45 s.
	}
	if s.ch.Cluster != "" {
		a = append(a, "-clickhouse.addrs="+strings.Join(s.ch.Addrs, ","), "-clickhouse.cluster="+s.ch.Cluster)
	} else {
		a = append(a, "-clickhouse.addr="+s.chAddr)
	}
	if len(s.redisCluster) > 0 {
		a = append(a, "-redis.cluster=true", "-redis.addrs="+strings.Join(s.redisCluster, ","))
	} else {
		a = append(a, "-redis.addr="+s.redisAddr)
	}
	return append(a, s.extra...)
}

// start runs one service (ingest, aggregator, enforcer, alerter) as a
// subprocess and waits until its /readyz answers 200.
func (s *stack) start(name string) *proc {
	s.t.Helper()
	p := s.spawn(name)
	s.waitReady(p)
	return p
}

func (s *stack) spawn(name string) *proc {
	s.t.Helper()
	return s.spawnAs(name, name)
}

// spawnAs runs service as the process called name, with extra flags after
// the stack's (a replica's own listen addresses and replica_id).
func (s *stack) spawnAs(name, service string, extra ...string) *proc {
	s.t.Helper()
	ops := freeAddr(s.t)
	p := &proc{name: name, service: service, extra: extra, opsAddr: ops, done: make(chan struct{}),
		logPath: filepath.Join(s.dir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))}
	logf, err := os.Create(p.logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	args := append(append([]string{"run"}, s.args(ops)...), extra...)
	p.cmd = exec.Command(sluiceBin, append(args, service)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.procs[name] = p
	s.mu.Unlock()
	return p
}

func (s *stack) waitReady(p *proc) {
	s.t.Helper()
	itest.EventuallyNoError(s.t, readyTimeout, p.name+" /readyz answers 200", func() error {
		if !p.alive() {
			s.t.Fatalf("%s exited before it was ready: %v\n%s", p.name, p.err, tail(p.logPath)) // waiting cannot help
		}
		code, _, err := httpGet(context.Background(), "http://"+p.opsAddr+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("readyz %d", code)
		}
		return nil
	})
}

func (s *stack) proc(name string) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[name]
}

// kill9 crashes a service: no shutdown, no flush, no commit.
func (s *stack) kill9(name string) {
	s.t.Helper()
	p := s.proc(name)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatalf("kill -9 %s: %v", name, err)
	}
	<-p.done
}

// stop asks a service to shut down (SIGTERM) and kills it when it does not
// finish within 45 s (its process's shutdown_timeout, 35 s, and a margin).
func (p *proc) stop() {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(45 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (s *stack) stopAll() {
	s.mu.Lock()
	ps := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
	if s.t.Failed() {
		for _, p := range ps {
			s.t.Logf("--- last log lines of %s (%s):\n%s", p.name, p.logPath, tail(p.logPath))
		}
	}
}

// requireAlive fails unless every started service still runs and its
// /healthz answers 200.
func (s *stack) requireAlive() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, p := range s.procs {
		if !p.alive() {
			s.t.Fatalf("%s exited: %v\n%s", name, p.err, tail(p.logPath))
		}
		code, _, err := httpGet(context.Background(), "http://"+p.opsAddr+"/healthz")
		if err != nil || code != http.StatusOK {
			s.t.Fatalf("%s /healthz: status %d, %v", name, code, err)
		}
	}
}

// metric returns the /metrics text of a service.
func (s *stack) metrics(name string) string {
	s.t.Helper()
	_, body, err := httpGet(context.Background(), "http://"+s.proc(name).opsAddr+"/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	return string(body)
}

// postEvents sends a body to ingest's /v1/events with key.
func (s *stack) postEvents(ctx context.Context, key, contentType string, body []byte) (int, []byte, http.Header, error) {
	return s.postEventsTo(ctx, s.ingestAddr, key, contentType, body)
}

// postEventsTo sends a body to the /v1/events of the ingest at addr.
func (s *stack) postEventsTo(ctx context.Context, addr, key, contentType string, body []byte) (int, []byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := ingestClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header, err
}

var ingestClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func httpGet(ctx context.Context, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func freeAddr(t testing.TB) string {
	t.Helper()
	return itest.FreeAddr(t)
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "sk-e2e-" + hex.EncodeToString(b[:])
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func orDefault(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
