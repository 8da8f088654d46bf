package aggregator_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestFlushFaults is issue 31's "done when" for the aggregator's flush: a
// failure, a SIGTERM and a SIGKILL landed on each step of a flush —
// producing the signals, writing the rows to ClickHouse, committing the
// offset — lose no event, row or signal. After the faulty process, a clean
// one catches up; ClickHouse then holds every event sent, every counter
// equals its events, and the signals published equal a clean run's.
//
// The faults are injected at the n-th time a flush reaches the step
// (internal/faults, testcmd's -fault), not by a kill at a random moment.
func TestFlushFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	bin := buildAggregator(t)
	for _, step := range []string{"produce", "write", "commit"} {
		for _, mode := range []string{"fail", "term", "kill"} {
			t.Run(step+"_"+mode, func(t *testing.T) {
				e := setup(t)
				logs := aggregatorLogs(t)
				final := produceWorkload(t, e)
				cmd := startAggregator(t, e, bin, logs, "-fault", step+":"+mode+":2")
				if mode == "fail" {
					itest.Eventually(t, 90*time.Second, "the aggregator to catch up after the failure", caughtUp(t, e))
					stopGracefully(t, cmd)
				} else {
					waitExit(t, cmd, 90*time.Second)
				}
				if !faultLanded(logs) {
					t.Fatalf("the fault %s:%s never landed", step, mode)
				}
				catchUpCleanly(t, e, bin, logs)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				checkOutcome(t, ctx, e, final)
			})
		}
	}
	// A flush on revoke that runs past shutdown_timeout flushes the
	// partitions the instance keeps too: those must not lose the batch.
	t.Run("revoke_past_grace", func(t *testing.T) {
		e := setup(t)
		logsA, logsB := aggregatorLogs(t), aggregatorLogs(t)
		final := produceWorkload(t, e)
		// A holds what it reads unflushed (30 s flush interval, huge
		// batches) until B joins and the revoke's flush stalls past A's
		// one-second grace.
		a := startAggregator(t, e, bin, logsA, "-fault", "produce:stall:1", "-shutdown-grace", "1s", "-flush", "30s", "-batch", "1000000")
		itest.Eventually(t, 60*time.Second, "A to consume", func() bool { return consumingSince(logsA, 0) })
		b := startAggregator(t, e, bin, logsB)
		itest.Eventually(t, 60*time.Second, "A's flush on revoke to fail", func() bool { return logged(logsA, "flush on revoke failed") })
		stopGracefully(t, a)
		itest.Eventually(t, 90*time.Second, "B to catch up", caughtUp(t, e))
		stopGracefully(t, b)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		checkOutcome(t, ctx, e, final)
	})
}

// produceWorkload sends the exactly-once workload and returns what must
// count.
func produceWorkload(t *testing.T, e *env) map[string]int64 {
	t.Helper()
	base := time.Now().UTC().Truncate(time.Hour).Add(-5 * time.Hour)
	evs, final := workload(12000, base)
	produce(t, e, evs)
	return final
}

// catchUpCleanly runs an aggregator without faults until the group has
// committed everything, then stops it gracefully.
func catchUpCleanly(t *testing.T, e *env, bin string, logs *os.File) {
	t.Helper()
	mark := logSize(t, logs)
	cmd := startAggregator(t, e, bin, logs)
	itest.Eventually(t, 120*time.Second, "a clean aggregator to catch up", caughtUp(t, e))
	itest.Eventually(t, 60*time.Second, "the clean aggregator to start", func() bool { return consumingSince(logs, mark) })
	stopGracefully(t, cmd)
}

func stopGracefully(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	waitExit(t, cmd, 60*time.Second)
}

// waitExit waits for cmd to end on its own (its exit status is not
// checked: a SIGKILLed or cut-short process fails).
func waitExit(t *testing.T, cmd *exec.Cmd, within time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("aggregator process did not exit within %v", within)
	}
}

func faultLanded(logs *os.File) bool { return logged(logs, "testcmd: fault") }

func logged(logs *os.File, s string) bool {
	b, _ := os.ReadFile(logs.Name())
	return strings.Contains(string(b), s)
}
