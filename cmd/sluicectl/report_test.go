package main

import (
	"strings"
	"testing"
)

// TestReportFlagsNameWhatTheyAccept: -by and -period take the levels and
// period kinds, a month is named by -month and a week or day by -date,
// and every mistake is refused naming the flag and what it accepts; the
// defaults are today's report (a tenant's month).
func TestReportFlagsNameWhatTheyAccept(t *testing.T) {
	cfg, err := loadReportConfig("report", "table", []string{"-month", "2026-11", "-tenant", "acme"})
	if err != nil || cfg.By != "tenant" || cfg.period().Kind != "month" || cfg.period().At != "2026-11" {
		t.Fatalf("defaults: %+v, %v; want by tenant, month 2026-11", cfg, err)
	}
	if cfg, err := loadReportConfig("report", "table", []string{"-by", "session", "-period", "week", "-date", "2026-11-30", "-tenant", "acme"}); err != nil ||
		cfg.period().At != "2026-11-30" {
		t.Fatalf("a week by session: %+v, %v", cfg, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-month", "2026-11", "-by", "team"}, `by: "team" is not one of organization, tenant, key, user, session`},
		{[]string{"-period", "year"}, `period: "year" is not one of month, week, day`},
		{[]string{"-period", "week"}, "date: is required with -period week, as YYYY-MM-DD"},
		{[]string{"-period", "day", "-date", "2026-11-31"}, `date "2026-11-31": want YYYY-MM-DD`},
		{[]string{"-period", "day", "-date", "2026-11-30", "-month", "2026-11"}, "month: names a month (-period month)"},
		{[]string{"-month", "2026-11", "-date", "2026-11-30"}, "date: names a week or a day"},
		{[]string{}, "month: is required with -period month"},
	} {
		if _, err := loadReportConfig("export", "csv", c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
