package policy

import "testing"

func TestTierRules(t *testing.T) {
	tiers := DefaultAlertTiers()
	for _, c := range []struct {
		pct  float64
		cur  int
		want int
	}{
		{69.9, 0, 0}, {70, 0, 70}, {95, 70, 90}, {120, 90, 100},
		{88, 90, 90}, // within 5 points of 90: stays
		{84, 90, 70}, // more than 5 below: down
		{10, 100, 0},
	} {
		if got := NextTier(tiers, c.pct, c.cur, 5); got != c.want {
			t.Errorf("NextTier(%v, cur %d) = %d, want %d", c.pct, c.cur, got, c.want)
		}
	}
	if got := TierReached(tiers, Percent(45, 50)); got != 90 {
		t.Errorf("TierReached(90%%) = %d, want 90", got)
	}
	if Percent(1, 0) != 0 {
		t.Error("Percent with no limit must be 0")
	}
	if TierSeverity(70) != SeverityInfo || TierSeverity(90) != SeverityWarning || TierSeverity(150) != SeverityCritical {
		t.Error("tier severities are info below 90, warning from 90, critical from 100")
	}
	if s, ok := ParseSeverity("warning"); !ok || s != SeverityWarning {
		t.Error("ParseSeverity(warning)")
	}
	if ExhaustionSeverity(60, 600) != SeverityCritical || ExhaustionSeverity(1200, 600) != SeverityWarning {
		t.Error("exhaustion severity: critical inside the critical horizon only")
	}
}
