package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestMain runs the sluice command itself when a test starts this binary
// as a child process with SLUICE_TEST_RUN_MAIN=1 (and sluice's arguments):
// what a signal does to the process can only be seen from outside it.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStopSignalDuringStartUp: a service stopped (SIGTERM) while it still
// waits for ClickHouse at start-up ends the wait and says why it stopped,
// instead of dying by the signal with nothing logged.
func TestStopSignalDuringStartUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := ln.Addr().String() // closed below: nothing answers there
	ln.Close()
	var out itest.Buffer
	// The enforcer writes ClickHouse (its audit), so the migrations run
	// first and wait for it.
	cmd := exec.Command(os.Args[0], "run", "-kafka.brokers=127.0.0.1:1", "-clickhouse.addr="+nobody,
		"-ops.listen=127.0.0.1:0", "-services.enforcer.admin.listen=", "-signal_auth.mode=off", "enforcer")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_RUN_MAIN=1")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	itest.Eventually(t, 30*time.Second, "the service waiting for ClickHouse", func() bool {
		return strings.Contains(out.String(), "waiting for ClickHouse")
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit after SIGTERM during start-up: %v, want status 1 (not killed by the signal); output:\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "sluice: stopped by a signal: migrate: ClickHouse at "+nobody+" not reachable") {
		t.Errorf("no line saying the start-up was stopped by a signal; output:\n%s", out.String())
	}
}
