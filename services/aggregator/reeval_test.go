package aggregator_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// signalWatch follows a signals topic from its start.
type signalWatch struct {
	t    testing.TB
	cl   *kgo.Client
	seen []schemas.Signal
}

func watchSignals(t testing.TB, e *env) *signalWatch {
	t.Helper()
	cl, err := kafkaconn.NewClient(e.kafka, kgo.ConsumeTopics(e.signals), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &signalWatch{t: t, cl: cl}
}

// has polls briefly and reports whether a signal matching pred arrived.
func (w *signalWatch) has(pred func(*schemas.Signal) bool) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		w.cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			var s schemas.Signal
			if err := schemas.DecodeSignal(r.Value, &s); err != nil {
				w.t.Errorf("undecodable signal: %v", err)
				return
			}
			w.seen = append(w.seen, s)
		})
		for i := range w.seen {
			if pred(&w.seen[i]) {
				return true
			}
		}
		return false
	}
}

func hourlyTier(tier int, dir schemas.Direction) func(*schemas.Signal) bool {
	return func(s *schemas.Signal) bool {
		return s.Kind == schemas.SignalTierCrossed && s.Tenant == "acme" && s.Model == "*" && s.Quota == schemas.QuotaHourlyTokens && s.Tier == tier && s.Direction == dir
	}
}

func writePolicy(t testing.TB, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestRaisedLimitUnblocksWithoutNewUsage: a tenant blocked at 100% of its
// hourly quota sends nothing more (the gateway refuses it); raising the
// limit tenfold in the policy file must take its tier down at once — the
// signal that closes the enforcer's quota breaker and resolves the alert —
// and rewrite quota_state, within 5 s and with no new event. (The whole
// chain to the lifted flag is e2e's TestRaisedLimitLiftsTheBlock.)
func TestRaisedLimitUnblocksWithoutNewUsage(t *testing.T) {
	e := integrationEnv(t, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 1000}\n")
	runInProcess(t, e, e.ch.Addr, nil)
	w := watchSignals(t, e)

	now := time.Now().UTC()
	produce(t, e, []schemas.UsageEvent{{ID: "block", Time: now, Tenant: "acme", Model: "gpt-4o", PromptTokens: 1000}})
	itest.Eventually(t, 60*time.Second, "acme at 100% of its hourly quota", w.has(hourlyTier(100, schemas.DirectionUp)))

	writePolicy(t, e.policy, "tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 10000}\n")
	itest.Eventually(t, 5*time.Second, "a tier_crossed down after the limit was raised, with no new usage", w.has(hourlyTier(0, schemas.DirectionDown)))
	itest.Eventually(t, 5*time.Second, "quota_state at the raised limit, tier 0", func() bool {
		var limit float64
		var tier uint16
		err := e.conn.QueryRow(context.Background(), `SELECT quota_limit, tier FROM quota_state FINAL
			WHERE tenant = 'acme' AND model = '*' AND quota = 'hourly_tokens' ORDER BY period_start DESC LIMIT 1`).Scan(&limit, &tier)
		return err == nil && limit == 10000 && tier == 0
	})
}
