package alert

import "testing"

func TestLabelsCarryTheDedupKey(t *testing.T) {
	a := Alert{Key: Key{Tenant: "acme", Model: "gpt-4o", Period: "day", Quota: "daily_tokens", Rule: RuleQuotaTier}, Tier: 90, Severity: SeverityWarning}
	l := a.Labels()
	want := map[string]string{"alertname": "SluiceQuotaTier", "tenant": "acme", "model": "gpt-4o", "period": "day", "quota": "daily_tokens", "tier": "90", "severity": "warning", "source": "sluice"}
	if len(l) != len(want) {
		t.Fatalf("labels %v", l)
	}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("%s = %q, want %q", k, l[k], v)
		}
	}
	b := Alert{Key: Key{Tenant: "acme", Model: "*", Rule: RuleBreakerOpen, Variant: "error_ratio"}, Severity: SeverityCritical}
	if l := b.Labels(); l["tier"] != "" || l["variant"] != "error_ratio" || l["period"] != "" || l["alertname"] != "SluiceBreakerOpen" {
		t.Errorf("breaker labels %v", l)
	}
}
