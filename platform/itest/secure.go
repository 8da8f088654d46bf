package itest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// servicesDir is where scripts/services.sh keeps its files: SLUICE_SERVICES_DIR,
// or .services/ in the repository holding the test's working directory.
func servicesDir() string {
	if d := os.Getenv("SLUICE_SERVICES_DIR"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		return ".services"
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "services.sh")); err == nil {
			return filepath.Join(dir, ".services")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ".services"
		}
		dir = parent
	}
}

// requireFile skips (fails under CI=true) when the services script has not
// written a file a secure accessor needs.
func requireFile(t testing.TB, service, path string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		return
	}
	msg := fmt.Sprintf("%s: %s is missing; `scripts/services.sh up %s` writes it", service, path, service)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// KafkaSCRAM returns the configuration of the real broker's SASL_PLAINTEXT
// listener (SCRAM-SHA-512), password read from the file the services
// script generated.
//
// The SCRAM user is written at storage format time, so a broker whose data
// directory predates the listener does not have it; KafkaSCRAM therefore
// upserts the user with that password over the plaintext listener first,
// which is idempotent and spares a reformat.
func KafkaSCRAM(t testing.TB) kafkaconn.Config {
	t.Helper()
	plain := Kafka(t)
	brokers := addr("SLUICE_ITEST_KAFKA_SCRAM_BROKERS", "127.0.0.1:19095")
	Require(t, "kafka", strings.Split(brokers, ",")[0])
	user := addr("SLUICE_ITEST_KAFKA_SCRAM_USER", "sluice")
	file := addr("SLUICE_ITEST_KAFKA_SCRAM_PASSWORD_FILE", filepath.Join(servicesDir(), "secrets", "kafka-scram-password"))
	requireFile(t, "kafka", file)
	pass, err := tlsconfig.Secret("kafka.sasl.password", "", file)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kafkaconn.NewClient(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{
		User: user, Mechanism: kadm.ScramSha512, Iterations: 8192, Password: pass,
	}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("kafka: upsert SCRAM user %s: %v", user, err)
	}

	c := plain
	c.Brokers = strings.Split(brokers, ",")
	c.SASL = kafkaconn.SASL{Mechanism: "SCRAM-SHA-512", Username: user, PasswordFile: file}
	return c
}

// RedisTLS returns the configuration of the real Redis's TLS port, with the
// services script's test CA and its ACL user (password from a file).
func RedisTLS(t testing.TB) redisconn.Config {
	t.Helper()
	c := Redis(t)
	c.Addr = addr("SLUICE_ITEST_REDIS_TLS_ADDR", "127.0.0.1:16380")
	Require(t, "redis", c.Addr)
	secrets := filepath.Join(servicesDir(), "secrets")
	ca := addr("SLUICE_ITEST_REDIS_TLS_CA_FILE", filepath.Join(secrets, "tls", "ca.pem"))
	pass := addr("SLUICE_ITEST_REDIS_PASSWORD_FILE", filepath.Join(secrets, "redis-password"))
	requireFile(t, "redis", ca)
	requireFile(t, "redis", pass)
	c.Username = addr("SLUICE_ITEST_REDIS_USER", "sluice")
	c.PasswordFile = pass
	c.TLS = tlsconfig.Config{Enabled: true, CAFile: ca}
	return c
}

// ServicePID returns the process id scripts/services.sh recorded for a
// service it started (kafka, clickhouse, redis, alertmanager), for
// benchmarks that charge each process its CPU time. It fails when the
// script did not start that service in this services folder.
func ServicePID(service string) (int, error) {
	path := filepath.Join(servicesDir(), "run", service+".pid")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("pid of %s: %w (`scripts/services.sh up %s` writes it)", service, err, service)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid of %s: %s holds %q, not a process id", service, path, b)
	}
	return pid, nil
}
