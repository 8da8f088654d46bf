package reconciler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/controlplane/controlplanetest"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/schemas"
)

func TestConfigValidateNamesFieldAndLimit(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	c := DefaultConfig()
	c.At = "25:00"
	c.RepairThreshold = 2
	c.MaxObservations = 1
	err := c.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"at: ", "repair_threshold: 2 is outside 0..1", "max_observations: 1 is outside 2..10"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	c = DefaultConfig()
	c.At = "00:05"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "settle") {
		t.Errorf("00:05 with a 15m settle accepted: %v", err)
	}
}

// fixedClock is 00:31 on 2026-10-15 in Shanghai, just after acme's
// nightly time; its After ticks quickly so the loop runs often.
type fixedClock struct{ now time.Time }

func (c fixedClock) Now() time.Time                         { return c.now }
func (c fixedClock) After(d time.Duration) <-chan time.Time { return time.After(50 * time.Millisecond) }

// TestServiceRepairsOnScheduleAndSignals runs the service against real
// ClickHouse and Kafka: at the tenant's 00:31 it audits the previous day,
// repairs the drifted counter and publishes reconciliation_drift.
func TestServiceRepairsOnScheduleAndSignals(t *testing.T) {
	repairsOnSchedule(t, false)
}

// Review finding: the reconciler read the policy file only, so a tenant
// made through the admin API (a record on the admin topic, as the
// aggregator counts it) was audited under the file's defaults, in UTC: at
// its 00:31 in Shanghai nothing was due, and its Shanghai day was never
// audited. Laying the records over the file, the reconciler audits it in
// its own zone, as the aggregator counted it.
func TestServiceAuditsARecordTenantInItsOwnZone(t *testing.T) {
	repairsOnSchedule(t, true)
}

// repairsOnSchedule is a tenant of Asia/Shanghai with a daily quota whose
// counter of 2026-10-14 drifted, defined in the policy file or, with
// record, only as a tenant record on the admin topic.
func repairsOnSchedule(t *testing.T, record bool) {
	ctx := context.Background()
	kcfg := itest.Kafka(t)
	chcfg, conn := migrationtest.Open(t)
	tenant := itest.Unique(t, "svc_")
	topics := itest.Topics(t)
	sigAuth := itest.SignalAuth(t)
	file := "tenants:\n  " + tenant + ":\n    timezone: Asia/Shanghai\n    models:\n      \"*\": {daily_tokens: 1000000}\n"
	if record {
		controlplanetest.ProduceTenant(t, kcfg, sigAuth, topics.Admin, tenant, `{"timezone":"Asia/Shanghai","models":{"*":{"daily_tokens":1000000}}}`)
		file = "{}\n" // the defaults: UTC, no quota
	}
	polPath := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polPath, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 10, 14, 0, 0, 0, 0, time.FixedZone("CST", 8*3600))
	eb, _ := conn.PrepareBatch(ctx, "INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, kafka_offset)")
	_ = eb.Append("s1", day.Add(3*time.Hour), tenant, "m", uint64(100), uint64(20), int64(1))
	_ = eb.Append("s2", day.Add(5*time.Hour), tenant, "m", uint64(300), uint64(80), int64(2))
	if err := eb.Send(); err != nil {
		t.Fatal(err)
	}
	qb, _ := conn.PrepareBatch(ctx, "INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used, quota_limit, unit, mode, version)")
	_ = qb.Append(tenant, "*", "daily_tokens", "day", day, day.AddDate(0, 0, 1), 999., 1000000., "tokens", "hard", uint64(4))
	if err := qb.Send(); err != nil {
		t.Fatal(err)
	}

	admin, err := kafkaconn.NewClient(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// A private signals topic: a drift signal on the shared one would reach
	// the alerter of any deployment on the same broker.
	signals := topics.Signals
	if err := kafkaconn.EnsureTopics(ctx, admin, kcfg, signals); err != nil {
		t.Fatal(err)
	}
	startMs := time.Now().Add(-time.Second).UnixMilli()

	cfg := DefaultConfig()
	// The drift signal is signed: the enforcer and alerter refuse others.
	verifier := itest.Signer(t, sigAuth)
	cfg.ConfirmDelay = 50 * time.Millisecond
	reg := prometheus.NewRegistry()
	env := platform.Env{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: reg, Health: ops.NewHealth(), Kafka: kcfg, ClickHouse: chcfg,
		Topics: topics, SignalAuth: sigAuth, Policy: platform.FileSource{File: polPath, Reload: time.Second}}
	svc, err := New(cfg, env, WithClock(fixedClock{now: time.Date(2026, 10, 15, 0, 31, 0, 0, day.Location())}))
	itest.StartService(t, svc, err)

	itest.EventuallyNoError(t, 60*time.Second, "the daily counter repaired to 500", func() error {
		var used float64
		if err := conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = ?", tenant).Scan(&used); err != nil {
			return err
		}
		if used != 500 {
			return fmt.Errorf("used is %v", used)
		}
		return nil
	})
	// The day audited is the tenant's own: 2026-10-14 in Shanghai. The run
	// is recorded after its repair.
	var first time.Time
	itest.EventuallyNoError(t, 30*time.Second, "the day's run recorded", func() error {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count(), min(period_start) FROM reconciliation_runs WHERE tenant = ? AND period = 'day'", tenant).Scan(&n, &first); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("no day run yet")
		}
		return nil
	})
	if !first.Equal(day) {
		t.Errorf("the first day audited starts at %v; want the tenant's %v", first, day)
	}

	cl, err := kafkaconn.NewClient(kcfg, kgo.ConsumeTopics(signals), kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(startMs)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pollCtx, pollCancel := context.WithTimeout(ctx, 60*time.Second)
	defer pollCancel()
	for {
		fs := cl.PollFetches(pollCtx)
		if pollCtx.Err() != nil {
			t.Fatal("no reconciliation_drift signal for the tenant within 60s")
		}
		var got *schemas.Signal
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != tenant {
				return
			}
			var s schemas.Signal
			if err := schemas.DecodeSignal(r.Value, &s); err == nil && s.Kind == schemas.SignalReconciliationDrift {
				got = &s
				if err := verifier.Verify(r); err != nil {
					t.Errorf("drift signal: %v", err)
				}
			}
		})
		if got != nil {
			if got.Used != 500 || got.Attributes["counter"] != "999" {
				t.Errorf("signal used %v counter %q, want truth 500 and counter 999", got.Used, got.Attributes["counter"])
			}
			break
		}
	}
}
