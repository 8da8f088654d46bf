package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// kafkaRecovery bounds how long after the restarted broker is ready a quota
// crossed meanwhile is flagged: clients reconnect, the consumer groups
// rejoin, the aggregator and the enforcer catch up.
const kafkaRecovery = 90 * time.Second

// privateKafka is a Kafka broker of this test alone, run by the services
// script under its own folder and ports, so restarting it disturbs nobody.
type privateKafka struct {
	dir    string
	script string
	env    []string
	addr   string
}

func startPrivateKafka(t testing.TB) *privateKafka {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "scripts", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	k := &privateKafka{dir: t.TempDir(), script: script}
	// The broker's jars are the shared ones: linking them saves a Maven
	// resolution per test.
	shared, err := filepath.Abs(filepath.Join("..", ".services", "cache", "kafka-libs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shared); err == nil {
		if err := os.MkdirAll(filepath.Join(k.dir, "cache"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(shared, filepath.Join(k.dir, "cache", "kafka-libs")); err != nil {
			t.Fatal(err)
		}
	}
	port, ctrl, sasl := freePort(t), freePort(t), freePort(t)
	k.addr = "127.0.0.1:" + strconv.Itoa(port)
	// Every listener on a port of its own: the shared broker holds the
	// script's default ports, its SASL listener's included.
	k.env = append(os.Environ(), "SLUICE_SERVICES_DIR="+k.dir,
		"SLUICE_KAFKA_PORT="+strconv.Itoa(port), "SLUICE_KAFKA_CONTROLLER_PORT="+strconv.Itoa(ctrl),
		"SLUICE_KAFKA_SASL_PORT="+strconv.Itoa(sasl),
		"SLUICE_READY_TIMEOUT=180")
	t.Cleanup(func() {
		out, err := k.services(t, "down")
		if err != nil {
			t.Logf("stopping the private Kafka: %v\n%s", err, out)
		}
	})
	k.up(t)
	return k
}

func (k *privateKafka) services(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(k.script, args...)
	cmd.Env = k.env
	return cmd.CombinedOutput()
}

func (k *privateKafka) up(t testing.TB) {
	t.Helper()
	if out, err := k.services(t, "up", "kafka"); err != nil {
		t.Fatalf("starting a private Kafka: %v\n%s", err, out)
	}
}

// kill9 crashes the broker by its pid file.
func (k *privateKafka) kill9(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k.dir, "run", "kafka.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	itest.EventuallyNoError(t, waitTimeout, "private Kafka process gone", func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("pid %d alive", pid)
		}
		return nil
	})
}

// TestFaultKafkaRestart crashes and restarts the Kafka broker (a private
// one) under load and checks that no event ingest acknowledged is lost or
// counted twice (ingest answers 503 while the broker is down and the
// loader retries, as a gateway does), and that a quota crossed after the
// restart is flagged within kafkaRecovery.
func TestFaultKafkaRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	k := startPrivateKafka(t)
	load, limited := faultTenants("e2e-kafka")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000}), KafkaBrokers: k.addr,
		Extra: []string{"-services.ingest.produce_timeout=3s"}})
	s.startAll("ingest", "aggregator", "enforcer")
	l := startLoader(t, s, 50, 20*time.Millisecond, load...)
	l.waitProgress(t, 1000)

	k.kill9(t)
	k.up(t)
	ready := time.Now()
	l.waitProgress(t, 1000)
	overTokens := pushOver(t, s, limited)
	s.waitQuotaFlag(t, limited, kafkaRecovery-time.Since(ready))
	l.stop()
	s.countersMatchTruth(t, l.snapshot())
	s.countersMatchTruthTokens(t, limited, overTokens)
	s.requireAlive()
	t.Logf("%d events acknowledged, %d batches refused during the outage and retried", l.ackedCount(), l.refused)
}

func freePort(t testing.TB) int {
	t.Helper()
	_, p, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}
