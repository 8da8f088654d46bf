package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// TestOverrideResolvesTheAlertAndLiftsTheBlock: a tenant blocked at 100% of
// its hourly quota gets a raised limit through the admin API. The override
// reaches the aggregator through sluice.admin.v1, so the tier falls and the
// quota alert resolves in Alertmanager, and the gateway serves again — with
// no new usage from the tenant (a refused tenant sends none).
func TestOverrideResolvesTheAlertAndLiftsTheBlock(t *testing.T) {
	// An alert resolves once its condition stayed clear for resolve_after.
	s, g, tenant := oneTenantStack(t, "e2e-override-", 1000, []string{"-services.alerter.rules.resolve_after=1s"}, "ingest", "aggregator", "enforcer", "alerter")
	const model = "gpt-4o-mini"
	ctx := context.Background()

	g.spend(t, tenant, model, 1050)
	s.waitAlert(t, tenant, "SluiceQuotaTier", "100")
	g.waitRefused(t, tenant, model)

	// On failure, show what the aggregator said: the signals tell whether
	// the override reached the tiers.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		cl, err := kafkaconn.NewClient(itest.Kafka(t), kgo.ConsumeTopics(s.signals), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			return
		}
		defer cl.Close()
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for c.Err() == nil {
			cl.PollFetches(c).EachRecord(func(r *kgo.Record) { t.Logf("signal: %s", r.Value) })
		}
	})
	admin, err := adminapi.NewClient("http://"+s.adminAddr, s.adminToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	limit := 100000.0
	if _, err := admin.SetOverride(ctx, adminapi.Request{Tenant: tenant, Model: "*", Quota: schemas.QuotaHourlyTokens,
		Limit: &limit, Reason: "e2e: promotion", ExpiresIn: "1h"}); err != nil {
		t.Fatal(err)
	}

	itest.EventuallyNoError(t, waitTimeout, "gateway serves again under the override", func() error {
		if d := g.checker.Check(tenant, model, "key-"+tenant); !d.Allowed() {
			return fmt.Errorf("still refused: %+v", d.Flag)
		}
		return nil
	})
	itest.EventuallyNoError(t, waitTimeout, "the quota alert resolved in Alertmanager", func() error {
		as, err := s.alerts(ctx, tenant)
		if err != nil {
			return err
		}
		for _, a := range as {
			if a.Labels["alertname"] == "SluiceQuotaTier" && a.Status.State == "active" {
				return fmt.Errorf("still firing: tier %s", a.Labels["tier"])
			}
		}
		return nil
	})
	used, err := s.counter(ctx, tenant, "hourly_tokens")
	if err != nil {
		t.Fatal(err)
	}
	if used != 1050 {
		t.Fatalf("hourly_tokens used %.0f after the override, want 1050: an override changes the limit, not the usage", used)
	}
	s.requireAlive()
}

// TestRaisedLimitLiftsTheBlock: a tenant blocked at 100% of its hourly
// quota sends nothing more; raising its limit in the policy file lifts the
// block (the aggregator re-evaluates it at once, the enforcer closes the
// quota breaker) with no new usage from the tenant.
func TestRaisedLimitLiftsTheBlock(t *testing.T) {
	s, g, tenant := oneTenantStack(t, "e2e-raised-", 1000, nil, "ingest", "aggregator", "enforcer")
	const model = "gpt-4o-mini"

	g.spend(t, tenant, model, 1050)
	g.waitRefused(t, tenant, model)
	s.writePolicy(policyYAML(map[string]int{tenant: 100000}))
	itest.EventuallyNoError(t, waitTimeout, "gateway serves again under the raised limit", func() error {
		if d := g.checker.Check(tenant, model, "key-"+tenant); !d.Allowed() {
			return fmt.Errorf("still refused: %+v", d.Flag)
		}
		return nil
	})
}
