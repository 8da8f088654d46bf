package aggregator_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// TestKillNineRestartsFromSnapshot: with snapshots on, an aggregator
// consumes half the workload, stores snapshots and is SIGKILLed; the next
// process restores from them, counts part of the second half (taking no
// snapshot) and is SIGKILLed mid-stream; the last restores its partitions
// from the snapshots plus the events stored since, instead of the month.
// Afterwards every quota_state and usage_minute row equals the sum over the
// distinct events in ClickHouse — what a full rebuild computes — and the
// signals published equal a clean run's.
func TestKillNineRestartsFromSnapshot(t *testing.T) {
	e := integrationEnv(t, "")
	bin := buildAggregator(t)
	logs := aggregatorLogs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	snapshots := func() (n uint64) {
		if err := e.conn.QueryRow(ctx, "SELECT count() FROM aggregator_snapshots").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	base := time.Now().UTC().Truncate(time.Hour).Add(-5 * time.Hour)
	evs, final := workload(12000, base)
	half := len(evs) / 2
	produce(t, e, evs[:half])
	cmd := startAggregator(t, e, bin, logs, "-snapshot-interval", "1s")
	itest.Eventually(t, 120*time.Second, "the first half consumed and snapshots stored", func() bool {
		done, end := committed(t, e)
		return done == end && snapshots() > 0
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	// The next processes load snapshots but take none within the test
	// (1h), so the last restart's snapshot lies below its committed
	// offset and the events between are replayed from ClickHouse.
	produce(t, e, evs[half:])
	done0, _ := committed(t, e)
	cmd = startAggregator(t, e, bin, logs, "-snapshot-interval", "1h")
	itest.Eventually(t, 90*time.Second, "progress before kill", func() bool {
		done, end := committed(t, e)
		return done >= done0+int64(len(evs))/12 || done == end
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	mark := logSize(t, logs)
	cmd = startAggregator(t, e, bin, logs, "-snapshot-interval", "1h")
	itest.Eventually(t, 120*time.Second, "the aggregator to catch up", func() bool {
		done, end := committed(t, e)
		return done == end
	})
	itest.Eventually(t, 60*time.Second, "the third aggregator to start", func() bool { return consumingSince(logs, mark) })
	restored := regexp.MustCompile(`msg="partition assigned and restored from a snapshot" .* events_replayed=[1-9]`)
	itest.Eventually(t, 60*time.Second, "a partition restored from a snapshot plus events stored after it", func() bool {
		b, _ := os.ReadFile(logs.Name())
		return restored.Match(b)
	})
	pol := checkOutcome(t, ctx, e, final)
	if replayed := checkSnapshotEqualsRebuild(t, ctx, e, pol); replayed == 0 {
		t.Error("no event stored after the snapshots was replayed: the restart from snapshot plus events was not checked")
	}

	// A graceful stop snapshots every partition at its committed offset,
	// though its interval (1h) is not due, so that the next owner replays
	// nothing — also the partitions whose state was restored by replaying
	// events after an older snapshot.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
	if b, _ := os.ReadFile(logs.Name()); !strings.Contains(string(b), `msg="partition snapshot stored at the stop"`) {
		t.Error("the graceful stop stored no snapshot")
	}
	if replayed := checkSnapshotEqualsRebuild(t, ctx, e, pol); replayed != 0 {
		t.Errorf("after the graceful stop a restart would replay %d events: every partition should have a snapshot at its committed offset", replayed)
	}
}

// checkSnapshotEqualsRebuild restores every partition as of its end from
// the snapshots the processes stored and the events stored since — the
// aggregator's restart path — and from a full replay, and compares every
// tenant × model total of every period (hour, day, month).
func checkSnapshotEqualsRebuild(t *testing.T, ctx context.Context, e *env, pol *policy.Policy) (replayed int) {
	t.Helper()
	store := chstore.New(e.conn, func() chstore.CostFunc { return nil }, 10_000)
	ends, err := e.adm.ListEndOffsets(ctx, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	compared := 0
	ends.Each(func(o kadm.ListedOffset) {
		full := tally.New(o.Partition, tally.DefaultOptions())
		full.SetPolicy(pol)
		full.SetReplay(true)
		full.SetClock(now)
		if _, err := store.Replay(ctx, o.Partition, o.Offset, func(ev *schemas.UsageEvent, off int64) { full.Apply(ev, off) }); err != nil {
			t.Fatal(err)
		}
		snap, n, err := store.LoadPartition(ctx, o.Partition, o.Offset, tally.DefaultOptions(), pol, func(st *tally.Partition) { st.SetClock(now) })
		if err != nil {
			t.Fatalf("partition %d: %v", o.Partition, err)
		}
		replayed += n
		for i := range 20 {
			tenant := fmt.Sprintf("t%d", i)
			for _, model := range []string{"*", "m0", "m1", "m2"} {
				for _, period := range []schemas.Period{schemas.PeriodHour, schemas.PeriodDay, schemas.PeriodMonth} {
					ft, fr, fc, fs, fok := full.Totals(tenant, model, string(period))
					st, sr, sc, ss, sok := snap.Totals(tenant, model, string(period))
					if fok != sok || ft != st || fr != sr || math.Abs(fc-sc) > 1e-9 || !fs.Equal(ss) {
						t.Errorf("partition %d %s/%s %s: from the snapshot %v %d tokens %d requests %g cost from %v, full rebuild %v %d %d %g from %v",
							o.Partition, tenant, model, period, sok, st, sr, sc, ss, fok, ft, fr, fc, fs)
					}
					if fok {
						compared++
					}
				}
			}
		}
	})
	if compared == 0 {
		t.Error("no total compared: the check checked nothing")
	}
	t.Logf("restart from the stored snapshots equals the full rebuild: %d totals, %d events replayed after the snapshots", compared, replayed)
	return replayed
}
