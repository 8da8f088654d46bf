package schedule

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time                         { return c.now }
func (c *fakeClock) After(d time.Duration) <-chan time.Time { return make(chan time.Time) }

func TestParseTimeOfDay(t *testing.T) {
	if got, err := ParseTimeOfDay("00:30"); err != nil || got != (TimeOfDay{0, 30}) {
		t.Fatalf("ParseTimeOfDay(00:30) = %v, %v", got, err)
	}
	for _, bad := range []string{"24:00", "7", "12:60", ""} {
		if _, err := ParseTimeOfDay(bad); err == nil {
			t.Errorf("ParseTimeOfDay(%q) accepted", bad)
		}
	}
}

func TestEachTenantRunsAtItsOwnLocalTime(t *testing.T) {
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	clock := &fakeClock{now: time.Date(2026, 11, 30, 16, 29, 0, 0, time.UTC)} // 00:29 on Dec 1 in Shanghai
	var got []Job
	s := &Scheduler{At: TimeOfDay{0, 30}, Interval: time.Minute, Clock: clock, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tenants: func(context.Context) ([]Tenant, error) {
			return []Tenant{{ID: "acme", Location: shanghai}, {ID: "utc-co", Location: time.UTC}}, nil
		},
		Run: func(_ context.Context, jobs []Job) error { got = append(got, jobs...); return nil },
	}
	ctx := context.Background()
	// utc-co's 00:30 passed 16 hours ago and it never ran: it catches up
	// at once; acme's 00:30 is a minute away.
	if n, _ := s.Check(ctx); n != 1 || len(got) != 1 || got[0].Tenant != "utc-co" {
		t.Fatalf("at 00:29 Shanghai ran %d tenants: %+v, want utc-co catching up", n, got)
	}
	got = nil
	clock.now = clock.now.Add(2 * time.Minute) // 00:31 Shanghai, 16:31 UTC
	if n, _ := s.Check(ctx); n != 1 {
		t.Fatalf("at 00:31 Shanghai ran %d tenants, want acme only", n)
	}
	if len(got) != 2 {
		t.Fatalf("jobs %+v, want the Shanghai day of Nov 30 and, it being the 1st, November", got)
	}
	for _, j := range got {
		if j.Tenant != "acme" {
			t.Errorf("job for %s ran at 16:31 UTC", j.Tenant)
		}
	}
	if start, _ := policy.PeriodBounds(got[0].Period, got[0].At, shanghai); got[0].Period != "day" || start.Format(time.DateOnly) != "2026-11-30" {
		t.Errorf("day job %+v covers %v, want Nov 30", got[0], start)
	}
	if start, _ := policy.PeriodBounds(got[1].Period, got[1].At, shanghai); got[1].Period != "month" || start.Format("2006-01") != "2026-11" {
		t.Errorf("month job %+v covers %v, want November", got[1], start)
	}
	got = nil
	clock.now = clock.now.Add(time.Hour)
	if n, _ := s.Check(ctx); n != 0 {
		t.Fatalf("acme ran twice on one night: %+v", got)
	}
	clock.now = time.Date(2026, 12, 1, 0, 30, 0, 0, time.UTC)
	if n, _ := s.Check(ctx); n != 1 || got[0].Tenant != "utc-co" {
		t.Fatalf("at 00:30 UTC want utc-co, got %+v", got)
	}
}

func TestFailedRunIsRetried(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 11, 10, 3, 0, 0, 0, time.UTC)}
	calls := 0
	s := &Scheduler{At: TimeOfDay{0, 30}, Interval: time.Minute, Clock: clock, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tenants: func(context.Context) ([]Tenant, error) { return []Tenant{{ID: "a", Location: time.UTC}}, nil },
		Run: func(context.Context, []Job) error {
			calls++
			if calls == 1 {
				return context.DeadlineExceeded
			}
			return nil
		},
	}
	for i := 0; i < 3; i++ {
		_, _ = s.Check(context.Background())
	}
	if calls != 2 {
		t.Fatalf("run called %d times, want a retry after the failure and then nothing", calls)
	}
}

// TestEachClosedHourIsAuditedOnce: with Hourly, every check adds the job
// of the last hour that ended at least Settle ago, once per hour, in the
// tenant's zone (Kathmandu is +05:45, so its hours start at :15 UTC), and
// alongside the nightly jobs when those are due too.
func TestEachClosedHourIsAuditedOnce(t *testing.T) {
	kathmandu, _ := time.LoadLocation("Asia/Kathmandu")
	clock := &fakeClock{now: time.Date(2026, 11, 10, 9, 44, 0, 0, time.UTC)} // 15:29 in Kathmandu
	var got []Job
	s := &Scheduler{At: TimeOfDay{0, 30}, Interval: time.Minute, Clock: clock, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hourly: true, Settle: 15 * time.Minute,
		Tenants: func(context.Context) ([]Tenant, error) { return []Tenant{{ID: "k", Location: kathmandu}}, nil },
		Run:     func(_ context.Context, jobs []Job) error { got = append(got, jobs...); return nil },
	}
	ctx := context.Background()
	hours := func() []string {
		var out []string
		for _, j := range got {
			if j.Period == "hour" {
				start, _ := policy.PeriodBounds(j.Period, j.At, kathmandu)
				out = append(out, start.Format("15:04"))
			}
		}
		return out
	}
	// 15:29: 14:00-15:00 settled at 15:15; the nightly day job is due too
	// (the tenant never ran).
	_, _ = s.Check(ctx)
	if h := hours(); len(h) != 1 || h[0] != "14:00" || len(got) != 2 {
		t.Fatalf("first check: jobs %+v (hours %v), want the day and the 14:00 hour", got, h)
	}
	got = nil
	clock.now = clock.now.Add(10 * time.Minute) // 15:39: 15:00-16:00 is open
	if _, _ = s.Check(ctx); len(got) != 0 {
		t.Fatalf("15:39: jobs %+v, want none (14:00 done, 15:00 open)", got)
	}
	clock.now = clock.now.Add(50 * time.Minute) // 16:29: 15:00 settled at 16:15
	_, _ = s.Check(ctx)
	if h := hours(); len(h) != 1 || h[0] != "15:00" || len(got) != 1 {
		t.Fatalf("16:29: jobs %+v (hours %v), want the 15:00 hour only", got, h)
	}
}

// TestMonthJobRunsOnTheBillingDay: a tenant billed from the 15th has its
// month audited on the night of the 15th — the month from the 15th of
// the last — and no month job on the 1st.
func TestMonthJobRunsOnTheBillingDay(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	tenant := Tenant{ID: "acme", Location: ny, BillingDay: 15}
	at := TimeOfDay{Hour: 0, Minute: 30}
	if jobs, _ := Due(tenant, time.Date(2026, 3, 1, 1, 0, 0, 0, ny), at, ""); len(jobs) != 1 || jobs[0].Period != schemas.PeriodDay {
		t.Errorf("on March 1st: %+v; want the day job alone", jobs)
	}
	jobs, _ := Due(tenant, time.Date(2026, 3, 15, 1, 0, 0, 0, ny), at, "")
	if len(jobs) != 2 || jobs[1].Period != schemas.PeriodMonth {
		t.Fatalf("on March 15th: %+v; want the day job and the month job", jobs)
	}
	cal := policy.Tenant{Location: ny, BillingDay: 15}
	start, end := cal.PeriodBounds(jobs[1].Period, jobs[1].At)
	if !start.Equal(time.Date(2026, 2, 15, 0, 0, 0, 0, ny)) || !end.Equal(time.Date(2026, 3, 15, 0, 0, 0, 0, ny)) {
		t.Errorf("the month job covers %v..%v; want February 15th..March 15th", start, end)
	}
}
