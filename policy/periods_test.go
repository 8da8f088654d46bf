package policy

import (
	"archive/zip"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// tzZone is one zone of the tz database as one loader reads it.
type tzZone struct {
	loc *time.Location
	// embedded: read from Go's copy (slim: rules past the last explicit
	// transition, the path time/tzdata takes), not the system zoneinfo.
	embedded bool
}

// tzZones returns every zone of Go's copy of the tz database, each loaded
// both from that copy and (when the machine has it) from the system
// zoneinfo, which is what time.LoadLocation reads first in production.
func tzZones(t *testing.T) []tzZone {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	zr, err := zip.OpenReader(filepath.Join(strings.TrimSpace(string(out)), "lib", "time", "zoneinfo.zip"))
	if err != nil {
		t.Fatalf("Go's tz database: %v", err)
	}
	defer zr.Close()
	var locs []tzZone
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, f.UncompressedSize64)
		if _, err := readFull(rc, data); err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		rc.Close()
		loc, err := time.LoadLocationFromTZData(f.Name, data)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		locs = append(locs, tzZone{loc, true})
		if sys, err := time.LoadLocation(f.Name); err == nil {
			locs = append(locs, tzZone{sys, false})
		}
	}
	if len(locs) < 400 {
		t.Fatalf("only %d zones in the tz database", len(locs))
	}
	return locs
}

func readFull(r interface{ Read([]byte) (int, error) }, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			if n == len(b) {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}

// transitions lists the instants in [from, to) at which loc's offset
// changes: every change Time.ZoneBounds reports, and every change found by
// sampling the offset each day and bisecting (ZoneBounds alone misses some
// past a zone's last explicit transition).
func transitions(loc *time.Location, from, to time.Time) []time.Time {
	seen := map[int64]bool{}
	add := func(u time.Time) {
		if !u.Before(from) && u.Before(to) && offsetChangesAt(loc, u) {
			seen[u.UnixNano()] = true
		}
	}
	at := from.In(loc)
	for range 100000 {
		_, end := at.ZoneBounds()
		if end.IsZero() || !end.Before(to) {
			break
		}
		add(end)
		at = later(end, at.Add(time.Hour))
	}
	for lo := from; lo.Before(to); lo = lo.Add(24 * time.Hour) {
		hi := lo.Add(24 * time.Hour)
		if o := offsetAt(lo, loc); offsetAt(hi, loc) != o {
			add(firstChange(loc, lo, hi, o))
		}
	}
	out := make([]time.Time, 0, len(seen))
	for ns := range seen {
		out = append(out, time.Unix(0, ns))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// checkPeriods walks the periods of kind from from to to, one after the
// other: each contains the instant it was asked for, starts where the
// previous one ended, and every instant inside it (its first and last
// nanosecond, the offset changes within it) maps to that same period.
// It reports at most *budget failures, so a broken function does not
// print a line per zone and transition.
func checkPeriods(t *testing.T, budget *int, loc *time.Location, trs []time.Time, kind schemas.Period, from, to time.Time, check func(s, e time.Time) string) int {
	t.Helper()
	fails := 0
	fail := func(format string, args ...any) {
		fails++
		if *budget > 0 {
			*budget--
			t.Errorf("%s %s: "+format, append([]any{loc, kind}, args...)...)
		}
	}
	at := from
	prevEnd := time.Time{}
	for n := 0; at.Before(to) && fails == 0; n++ {
		s, e := PeriodBounds(kind, at, loc)
		if s.After(at) || !e.After(at) {
			fail("PeriodBounds(%s) = [%s, %s) does not contain it", at.In(loc), s.In(loc), e.In(loc))
			break
		}
		if !prevEnd.IsZero() && !s.Equal(prevEnd) {
			fail("period [%s, %s) does not start where the previous one ended (%s)", s.In(loc), e.In(loc), prevEnd.In(loc))
		}
		probes := []time.Time{s, e.Add(-time.Nanosecond), s.Add(e.Sub(s) / 2)}
		i := sort.Search(len(trs), func(i int) bool { return !trs[i].Before(s) })
		for ; i < len(trs) && trs[i].Before(e); i++ {
			probes = append(probes, trs[i])
		}
		for _, p := range probes {
			if ps, pe := PeriodBounds(kind, p, loc); !ps.Equal(s) || !pe.Equal(e) {
				fail("%s maps to [%s, %s), not to its period [%s, %s)", p.In(loc), ps.In(loc), pe.In(loc), s.In(loc), e.In(loc))
			}
		}
		if msg := check(s, e); msg != "" {
			fail("[%s, %s) (%s): %s", s.In(loc), e.In(loc), e.Sub(s), msg)
		}
		prevEnd, at = e, e
	}
	return fails
}

// offsetChangesAt says whether loc's UTC offset changes at instant u.
func offsetChangesAt(loc *time.Location, u time.Time) bool {
	_, o1 := u.Add(-time.Nanosecond).In(loc).Zone()
	_, o2 := u.In(loc).Zone()
	return o1 != o2
}

// TestPeriodBoundsHoldInEveryZoneAcrossEveryTransition checks the period
// contract of PeriodBounds in every zone of the tz database, as Go's copy
// and as the system's zoneinfo: around every offset change from 2025 to
// 2027 (from 1970 to 2038 in Go's copy, unless -short or -race), every
// day of 2026
// and every month from 2000 to 2038 (of 2026 in the system's), each period
// contains the instant asked for, periods are contiguous and do not
// overlap. An hour is at most 60 real minutes and exactly 60 unless the
// offset changes at its start or end; it starts on a local whole hour
// unless the offset changes there. A day starts at local midnight (or at
// the first instant of the date when midnight is skipped) and is the
// local calendar day (23 or 25 hours on a DST change); a month starts on
// the first day of a local month.
func TestPeriodBoundsHoldInEveryZoneAcrossEveryTransition(t *testing.T) {
	year, yearEnd := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	hour := func(loc *time.Location) func(s, e time.Time) string {
		return func(s, e time.Time) string {
			d := e.Sub(s)
			switch {
			case d > time.Hour:
				return "longer than an hour"
			case d < time.Hour && !offsetChangesAt(loc, s) && !offsetChangesAt(loc, e):
				return "shorter than an hour with no offset change at either end"
			case s.In(loc).Minute() != 0 && !offsetChangesAt(loc, s):
				return "starts off the local hour with no offset change there"
			}
			return ""
		}
	}
	day := func(loc *time.Location) func(s, e time.Time) string {
		return func(s, e time.Time) string {
			ls := s.In(loc)
			if (ls.Hour() != 0 || ls.Minute() != 0) && !offsetChangesAt(loc, s) {
				return "starts off local midnight with no offset change there"
			}
			if e.Sub(s) > 49*time.Hour {
				return "longer than two days"
			}
			return ""
		}
	}
	month := func(loc *time.Location) func(s, e time.Time) string {
		return func(s, e time.Time) string {
			ls := s.In(loc)
			if ls.Day() != 1 || (ls.Hour() != 0 || ls.Minute() != 0) && !offsetChangesAt(loc, s) {
				return "does not start at local midnight of the 1st"
			}
			return ""
		}
	}
	zones := tzZones(t)
	failed, budget := 0, 20
	for _, z := range zones {
		loc := z.loc
		from, to := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
		mfrom, mto := year, yearEnd
		if z.embedded {
			mfrom, mto = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2038, 1, 1, 0, 0, 0, 0, time.UTC)
			if !testing.Short() && !raceEnabled {
				from, to = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), mto
			}
		}
		f := 0
		trs := transitions(loc, from.Add(-24*time.Hour), to)
		for _, tr := range trs {
			f += checkPeriods(t, &budget, loc, trs, schemas.PeriodHour, tr.Add(-3*time.Hour), tr.Add(3*time.Hour), hour(loc))
			f += checkPeriods(t, &budget, loc, trs, schemas.PeriodDay, tr.Add(-50*time.Hour), tr.Add(50*time.Hour), day(loc))
		}
		f += checkPeriods(t, &budget, loc, trs, schemas.PeriodDay, year, yearEnd, day(loc))
		f += checkPeriods(t, &budget, loc, trs, schemas.PeriodMonth, mfrom, mto, month(loc))
		if f > 0 {
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d zones have wrong periods", failed, len(zones))
	}
}

// TestPeriodBoundsAtTheReportedDSTCases pins the cases of issue 31 item 7
// and the meaning of an hour and a day across a change.
func TestPeriodBoundsAtTheReportedDSTCases(t *testing.T) {
	load := func(name string) *time.Location {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		name       string
		zone       string
		period     schemas.Period
		at         string
		start, end string
	}{
		// New York falls back at 06:00 UTC: 01:05 EST (the second 01:05)
		// is in the second 01:00 hour, a real hour of its own.
		{"NY 01:05 EDT", "America/New_York", schemas.PeriodHour, "2026-11-01T05:05:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z"},
		{"NY 01:05 EST", "America/New_York", schemas.PeriodHour, "2026-11-01T06:05:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"},
		{"NY fall-back day is 25h", "America/New_York", schemas.PeriodDay, "2026-11-01T06:05:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		// Berlin falls back at 01:00 UTC: 02:05 CEST is 00:05 UTC.
		{"Berlin 02:05 CEST", "Europe/Berlin", schemas.PeriodHour, "2026-10-25T00:05:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z"},
		{"Berlin 02:05 CET", "Europe/Berlin", schemas.PeriodHour, "2026-10-25T01:05:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"},
		// Berlin springs forward at 01:00 UTC: 01:00 CET is followed by 03:00 CEST.
		{"Berlin 01:30 CET", "Europe/Berlin", schemas.PeriodHour, "2026-03-29T00:30:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z"},
		{"Berlin 03:30 CEST", "Europe/Berlin", schemas.PeriodHour, "2026-03-29T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"},
		// Santiago springs forward at local midnight (04:00 UTC): the
		// day before ends there, and the next starts at 01:00 local.
		{"Santiago day before spring-forward", "America/Santiago", schemas.PeriodDay, "2026-09-06T03:30:00Z", "2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z"},
		{"Santiago spring-forward day", "America/Santiago", schemas.PeriodDay, "2026-09-06T04:30:00Z", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"},
		// Havana springs forward at local midnight (05:00 UTC) too.
		{"Havana day before spring-forward", "America/Havana", schemas.PeriodDay, "2026-03-08T04:30:00Z", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"},
		// Lord Howe moves by 30 minutes: the hour of the change is cut
		// at the change, never longer than an hour.
		{"Lord Howe fall-back", "Australia/Lord_Howe", schemas.PeriodHour, "2026-04-04T14:40:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:00:00Z"},
		{"Lord Howe after fall-back", "Australia/Lord_Howe", schemas.PeriodHour, "2026-04-04T15:10:00Z", "2026-04-04T15:00:00Z", "2026-04-04T15:30:00Z"},
	} {
		loc := load(c.zone)
		s, e := PeriodBounds(c.period, utc(c.at), loc)
		if !s.Equal(utc(c.start)) || !e.Equal(utc(c.end)) {
			t.Errorf("%s: PeriodBounds(%s, %s) = [%s, %s), want [%s, %s)", c.name, c.period, c.at,
				s.UTC().Format(time.RFC3339), e.UTC().Format(time.RFC3339), c.start, c.end)
		}
	}
}

// TestWeekAndBillingDayPeriods: a limit's weekly period runs from the
// tenant's first weekday (Monday by default) and a monthly one with
// anchor_day from that day of the month, in the tenant's zone and across
// its clock changes: New York's week of the spring-forward is 167 real
// hours, Kolkata's Sunday weeks end at Sunday midnight there, London's
// billing month from the 15th spans the autumn change (one hour longer),
// and an anchor of the 31st starts February's period on the 28th.
func TestWeekAndBillingDayPeriods(t *testing.T) {
	p, err := Parse([]byte(`
tenants:
  ny:
    timezone: America/New_York
    limits:
      weekly: {unit: total_tokens, period: {every: week, limit: 100}}
  kol:
    timezone: Asia/Kolkata
    week_start: sunday
    limits:
      weekly: {unit: total_tokens, period: {every: week, limit: 100}}
  lon:
    timezone: Europe/London
    limits:
      billing: {unit: cost, period: {every: month, anchor_day: 15, limit: 100}}
      end-of-month: {unit: cost, period: {every: month, anchor_day: 31, limit: 100}}
  billed-20th:
    timezone: Europe/London
    billing_day: 20
    limits:
      monthly: {unit: cost, period: {every: month, limit: 100}}
      own: {unit: cost, period: {every: month, anchor_day: 15, limit: 100}}
`), "periods.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := p.AdmissionRules()
	zone := func(name string) *time.Location {
		l, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ny, kol, lon := zone("America/New_York"), zone("Asia/Kolkata"), zone("Europe/London")
	for _, tc := range []struct {
		tenant, rule string
		at           time.Time
		start, end   time.Time
	}{
		{"ny", "weekly", time.Date(2026, 3, 8, 12, 0, 0, 0, ny), time.Date(2026, 3, 2, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{"kol", "weekly", time.Date(2026, 12, 5, 23, 59, 0, 0, kol), time.Date(2026, 11, 29, 0, 0, 0, 0, kol), time.Date(2026, 12, 6, 0, 0, 0, 0, kol)},
		{"kol", "weekly", time.Date(2026, 12, 6, 0, 0, 0, 0, kol), time.Date(2026, 12, 6, 0, 0, 0, 0, kol), time.Date(2026, 12, 13, 0, 0, 0, 0, kol)},
		{"lon", "billing", time.Date(2026, 11, 1, 9, 0, 0, 0, lon), time.Date(2026, 10, 15, 0, 0, 0, 0, lon), time.Date(2026, 11, 15, 0, 0, 0, 0, lon)},
		{"lon", "billing", time.Date(2026, 10, 14, 23, 59, 0, 0, lon), time.Date(2026, 9, 15, 0, 0, 0, 0, lon), time.Date(2026, 10, 15, 0, 0, 0, 0, lon)},
		{"lon", "end-of-month", time.Date(2026, 3, 10, 0, 0, 0, 0, lon), time.Date(2026, 2, 28, 0, 0, 0, 0, lon), time.Date(2026, 3, 31, 0, 0, 0, 0, lon)},
		// A tenant's billing_day starts its month limits unless a limit
		// names its own anchor_day.
		{"billed-20th", "monthly", time.Date(2026, 3, 19, 0, 0, 0, 0, lon), time.Date(2026, 2, 20, 0, 0, 0, 0, lon), time.Date(2026, 3, 20, 0, 0, 0, 0, lon)},
		{"billed-20th", "own", time.Date(2026, 3, 19, 0, 0, 0, 0, lon), time.Date(2026, 3, 15, 0, 0, 0, 0, lon), time.Date(2026, 4, 15, 0, 0, 0, 0, lon)},
	} {
		r := ruleNamed(t, rs.Tenants[tc.tenant].Rules, tc.rule)
		s, e := r.Calendar.Bounds(tc.at)
		if !s.Equal(tc.start) || !e.Equal(tc.end) {
			t.Errorf("%s %s at %s: %s .. %s, want %s .. %s", tc.tenant, tc.rule, tc.at, s, e, tc.start, tc.end)
		}
	}
	// ... and its quotas' and budget's months, which the pipeline counts.
	if s, e := p.Tenant("billed-20th").PeriodBounds(schemas.PeriodMonth, time.Date(2026, 10, 25, 0, 0, 0, 0, lon)); !s.Equal(time.Date(2026, 10, 20, 0, 0, 0, 0, lon)) || e.Sub(s) != (31*24+1)*time.Hour {
		t.Errorf("billed-20th's month of October 25th: %s .. %s, want from October 20th, 745h long", s, e)
	}
	if s, e := WeekBounds(time.Date(2026, 3, 8, 12, 0, 0, 0, ny), ny, time.Monday); e.Sub(s) != 167*time.Hour {
		t.Errorf("New York's spring-forward week lasts %s, want 167h", e.Sub(s))
	}
	if s, e := AnchoredMonthBounds(time.Date(2026, 11, 1, 9, 0, 0, 0, lon), lon, 15); e.Sub(s) != (31*24+1)*time.Hour {
		t.Errorf("London's billing month over the autumn change lasts %s, want 745h", e.Sub(s))
	}
	_, err = Parse([]byte(`
tenants:
  x:
    week_start: someday
    billing_day: 0
    limits:
      a: {unit: requests, period: {every: day, anchor_day: 3, limit: 1}}
      b: {unit: requests, period: {every: month, anchor_day: 32, limit: 1}}
`), "bad.yaml")
	for _, want := range []string{`tenants.x.week_start: "someday" is not a day of the week`, "tenants.x.limits.a.period.anchor_day: 3: a monthly period's",
		"tenants.x.limits.b.period.anchor_day: 32", "tenants.x.billing_day: 0: the day of the month"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
}

// TestOneOffPeriod: period every: once with expires_at is one period
// that ends at expires_at whatever the time (so its counter keeps what
// was spent), and its rule expires then (admission.Rule.Expires); a
// tenant making an inherited one-off budget periodic drops the expiry.
// expires_at is required with once, must be RFC 3339, and belongs to
// once alone, each error naming the field.
func TestOneOffPeriod(t *testing.T) {
	p, err := Parse([]byte(`
defaults:
  limits:
    promo: {scope: {key: "*"}, unit: cost, period: {every: once, limit: 50, expires_at: "2026-12-04T18:00:00+01:00"}}
tenants:
  paris: {timezone: Europe/Paris}
  steady:
    limits:
      promo: {period: {every: month}}
`), "once.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := p.AdmissionRules()
	friday := time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC)
	for _, tr := range []struct {
		name  string
		rules []admission.Rule
	}{{"paris", rs.Tenants["paris"].Rules}, {"defaults", rs.Default.Rules}} {
		r := ruleNamed(t, tr.rules, "promo")
		if !r.Expires.Equal(friday) || r.Limit != 50*admission.CostScale || r.Algorithm != admission.CalendarPeriod {
			t.Errorf("%s: promo %+v, want $50 expiring at %s", tr.name, r, friday)
		}
		for _, at := range []time.Time{friday.Add(-30 * 24 * time.Hour), friday.Add(-time.Second), friday.Add(time.Hour)} {
			if s, e := r.Calendar.Bounds(at); s.UnixMilli() != 0 || !e.Equal(friday) {
				t.Errorf("%s: promo's period at %s: %s .. %s, want the epoch .. %s", tr.name, at, s, e, friday)
			}
		}
	}
	if r := ruleNamed(t, rs.Tenants["steady"].Rules, "promo"); !r.Expires.IsZero() {
		t.Errorf("steady's monthly promo expires at %s, want never", r.Expires)
	}

	_, err = Parse([]byte(`
limits:
  a: {unit: cost, period: {every: once, limit: 5}}
  b: {unit: cost, period: {every: once, limit: 5, expires_at: "next friday"}}
  c: {unit: cost, period: {every: month, limit: 5, expires_at: "2026-12-04T18:00:00Z"}}
  d: {unit: cost, period: {every: fortnight, limit: 5}}
`), "bad.yaml")
	for _, want := range []string{"limits.a.period.expires_at: is required with every: once",
		`limits.b.period.expires_at: "next friday" is not an RFC 3339 time`,
		"limits.c.period.expires_at: only a one-off period (every: once) expires",
		`limits.d.period.every: "fortnight" is not hour, day, week, month or once`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
}
