package alerter

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
)

// TestATenantsWebhookCarriesThatTenantOnly defines a webhook per tenant in
// the policy, as a tenant's own endpoint would be: each receives its
// tenant's alerts and no other's, and a channel bound to its tenant
// refuses another tenant's alert even when the policy routes it there by
// mistake.
func TestATenantsWebhookCarriesThatTenantOnly(t *testing.T) {
	acmeHook, globexHook := newReceiver(t, "webhook"), newReceiver(t, "webhook")
	acme, globex, initech := itest.Unique(t, "acme_"), itest.Unique(t, "globex_"), itest.Unique(t, "initech_")
	pol := fmt.Sprintf(`defaults: {channels: [alertmanager]}
tenants:
  %[1]s: {channels: [webhook:acme]}
  %[2]s: {channels: [webhook:globex]}
  %[3]s: {channels: [webhook:acme]}   # a mistake: acme's endpoint named for another tenant
channels:
  webhook:
    acme: {url: %[4]q, secret: %[6]q, tenant: %[1]s}
    globex: {url: %[5]q, secret: %[6]q}
`, acme, globex, initech, acmeHook.url(), globexHook.url(), robotSecret)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := policy.NewWatcher(path, time.Hour, nil, policy.WithChannelCheck(channelKinds.Check))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Rules.GroupWait = 0
	p := runningPipeline(t, cfg, w)

	now := time.Now().UTC()
	for _, tenant := range []string{acme, globex, initech} {
		p.engine.Observe(tierSignal(tenant, 70, 90, now), now)
	}
	for range 10 {
		now = now.Add(10 * time.Second)
		p.engine.Tick(now)
	}
	sent, failed := p.metrics.Sent, p.metrics.Failed
	itest.Eventually(t, 30*time.Second, "acme's and globex's alerts delivered, initech's refused", func() bool {
		return testutil.ToFloat64(sent.WithLabelValues("webhook:acme")) == 1 && testutil.ToFloat64(sent.WithLabelValues("webhook:globex")) == 1 &&
			testutil.ToFloat64(failed.WithLabelValues("webhook:acme")) == 1
	})
	for rc, tenant := range map[*receiver]string{acmeHook: acme, globexHook: globex} {
		titles, bodies, errs := rc.got()
		if len(errs) > 0 || len(titles) != 1 || !strings.Contains(titles[0], tenant) {
			t.Errorf("%s's webhook got %q (refused %v)", tenant, titles, errs)
		}
		for _, b := range bodies {
			for _, other := range []string{acme, globex, initech} {
				if other != tenant && strings.Contains(b, other) {
					t.Errorf("%s's webhook got %s's alert: %s", tenant, other, b)
				}
			}
		}
	}
}
