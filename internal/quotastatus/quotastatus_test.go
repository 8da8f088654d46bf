package quotastatus

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

type fakeState struct {
	rows    []TenantQuota
	refused map[string]int64
	err     error
}

func (f fakeState) Quotas(_ context.Context, tenant string, _ time.Time) ([]TenantQuota, error) {
	var out []TenantQuota
	for _, r := range f.rows {
		if tenant == "" || r.Tenant == tenant {
			out = append(out, r)
		}
	}
	return out, f.err
}

func (f fakeState) Refused(context.Context, string, time.Time) (map[string]int64, error) {
	return f.refused, f.err
}

type fakeFlags map[string][]Flag

func (f fakeFlags) Flags(_ context.Context, tenant string, _ time.Time) ([]Flag, error) {
	return f[tenant], nil
}
func (f fakeFlags) AllFlags(context.Context, time.Time) (map[string][]Flag, error) { return f, nil }

const testPolicy = `
defaults:
  timezone: UTC
  models:
    "*": {monthly_tokens: 1000000}
plans:
  starter:
    models:
      "*": {daily_tokens: 50000}
tenants:
  runaway:
    plan: starter
    models:
      "*": {hourly_tokens: 500000, count: billed}
      gpt-4o: {requests_per_minute: 60}
`

func TestTenantMergesStoredQuotasWithThePolicys(t *testing.T) {
	p, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 10, 14, 20, 30, 0, time.UTC)
	pred := now.Add(4 * time.Minute)
	upd := now.Add(-time.Second)
	stored := TenantQuota{Tenant: "runaway", Quota: Quota{Model: "*", Quota: schemas.QuotaHourlyTokens, Period: schemas.PeriodHour,
		Unit: schemas.UnitTokens, Mode: schemas.ModeHard, Limit: 500000, Used: 460000, Tier: 90,
		PeriodStart: now.Truncate(time.Hour), ResetsAt: now.Truncate(time.Hour).Add(time.Hour), RatePerMinute: 10000,
		PredictedExhaustion: &pred, UpdatedAt: &upd}}
	until := now.Add(time.Hour)
	svc := New(fakeState{rows: []TenantQuota{stored, {Tenant: "other", Quota: stored.Quota}}, refused: map[string]int64{"runaway": 7}},
		fakeFlags{"runaway": {{Model: "*", State: flags.StateOpen, Kind: flags.KindManual, Until: &until, Reason: "ops"}}},
		func() *policy.Policy { return p }).WithClock(func() time.Time { return now })

	st, err := svc.Tenant(context.Background(), "runaway")
	if err != nil {
		t.Fatal(err)
	}
	if st.Plan != "starter" || st.RefusedLastHour != 7 || len(st.Flags) != 1 || !st.Refusing() {
		t.Fatalf("plan %q refused %d flags %+v", st.Plan, st.RefusedLastHour, st.Flags)
	}
	// "*" first, periods from short to long, then the model's own quotas.
	want := []struct {
		model string
		quota schemas.QuotaKind
		used  float64
	}{{"*", schemas.QuotaHourlyTokens, 460000}, {"*", schemas.QuotaDailyTokens, 0}, {"*", schemas.QuotaMonthlyTokens, 0},
		{"gpt-4o", schemas.QuotaRequestsPerMinute, 0}}
	if len(st.Quotas) != len(want) {
		t.Fatalf("got %d quotas, want %d: %+v", len(st.Quotas), len(want), st.Quotas)
	}
	for i, w := range want {
		q := st.Quotas[i]
		if q.Model != w.model || q.Quota != w.quota || q.Used != w.used {
			t.Errorf("quota %d: got %s/%s used %v, want %s/%s used %v", i, q.Model, q.Quota, q.Used, w.model, w.quota, w.used)
		}
	}
	// count: billed (the tenant's "*" entry) marks its token quotas,
	// stored or not; the others count total tokens.
	for i, want := range []string{"billed", "billed", "billed", ""} {
		if st.Quotas[i].Count != want {
			t.Errorf("quota %d (%s/%s): count %q, want %q", i, st.Quotas[i].Model, st.Quotas[i].Quota, st.Quotas[i].Count, want)
		}
	}
	h := st.Quotas[0]
	if h.Remaining != 40000 || h.UsedPercent != 92 || h.PredictedExhaustion == nil || !h.PredictedExhaustion.Equal(pred) {
		t.Errorf("hourly: remaining %v used %v%% prediction %v", h.Remaining, h.UsedPercent, h.PredictedExhaustion)
	}
	// An unused quota resets at its period's end in the tenant's zone.
	d := st.Quotas[1]
	if d.Limit != 50000 || d.Remaining != 50000 || !d.ResetsAt.Equal(time.Date(2026, 3, 11, 0, 0, 0, 0, time.UTC)) || d.UpdatedAt != nil {
		t.Errorf("daily from the plan: %+v", d)
	}
	if w := st.Worst(); w == nil || w.Quota != schemas.QuotaHourlyTokens || st.Tier() != 90 || st.NextExhaustion() == nil {
		t.Errorf("worst %+v tier %d", w, st.Tier())
	}

	all, err := svc.Overview(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Tenant != "other" || all[1].Tenant != "runaway" {
		t.Fatalf("overview tenants: %+v", all)
	}
	if len(all[1].Quotas) != len(st.Quotas) || all[1].Quotas[0] != st.Quotas[0] {
		t.Errorf("the overview's runaway differs from Tenant's:\n%+v\n%+v", all[1].Quotas, st.Quotas)
	}
}

func TestZeroLimitIsFullyUsed(t *testing.T) {
	q := Quota{Limit: 0, Used: 12}
	derive(&q)
	if q.UsedPercent != 100 || q.Remaining != 0 {
		t.Fatalf("an override to 0 stops spend: %+v", q)
	}
}

func TestTenantRefusesBadNamesAndPassesStoreErrors(t *testing.T) {
	svc := New(fakeState{}, nil, nil)
	if _, err := svc.Tenant(context.Background(), "bad tenant"); !errors.Is(err, ErrBadTenant) {
		t.Fatalf("bad name: %v", err)
	}
	boom := errors.New("clickhouse down")
	svc = New(fakeState{err: boom}, nil, nil)
	if _, err := svc.Tenant(context.Background(), "acme"); !errors.Is(err, boom) || errors.Is(err, ErrBadTenant) {
		t.Fatalf("store error: %v", err)
	}
	st, err := New(fakeState{}, nil, nil).Tenant(context.Background(), "acme")
	if err != nil || st.Quotas == nil || st.Flags == nil {
		t.Fatalf("empty status must have empty lists, not null: %+v %v", st, err)
	}
}

// TestPredictionSaysWhenWithItsRangeAndBasis: what the console and
// sluicectl show for each state of a prediction.
func TestPredictionSaysWhenWithItsRangeAndBasis(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	for _, c := range []struct {
		q    Quota
		want string
	}{
		{Quota{}, "-"},
		{Quota{PredictedExhaustion: at(65 * time.Second), PredictedEarliest: at(50 * time.Second), PredictedLatest: at(100 * time.Second), PredictionBasis: "rates"},
			"in 1m5s (50s-1m40s) rates"},
		{Quota{PredictedExhaustion: at(time.Hour), PredictedEarliest: at(40 * time.Minute), PredictionBasis: "forecast"}, "in 1h0m (40m0s-) forecast"},
		{Quota{PredictedExhaustion: at(3*time.Hour + 54*time.Minute + 32*time.Second), PredictedEarliest: at(3*time.Hour + 39*time.Minute),
			PredictedLatest: at(4*time.Hour + 11*time.Minute + 43*time.Second)}, "in 3h55m (3h39m-4h12m)"},
		{Quota{PredictedExhaustion: at(-time.Second), PredictedEarliest: at(-time.Minute), PredictionBasis: "rates"}, "now"},
	} {
		if got := c.q.Prediction(now); got != c.want {
			t.Errorf("%+v: %q, want %q", c.q, got, c.want)
		}
	}
}
