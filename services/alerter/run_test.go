package alerter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// TestRunFromKafkaToAlertmanager runs the service end to end: signals
// produced to Kafka (a poison record among them) become an Alertmanager
// alert in the tenant's language, and a period reset resolves it.
func TestRunFromKafkaToAlertmanager(t *testing.T) {
	kcfg := itest.Kafka(t)
	am := itest.Alertmanager(t)
	tenant := itest.Unique(t, "run_")
	topic := itest.Unique(t, "signals_")

	cfg := DefaultConfig()
	cfg.Group = topic
	cfg.Alertmanager.URL = am
	cfg.Rules.PendingFor, cfg.Rules.ResolveAfter = 0, 0
	cfg.Tick = 20 * time.Millisecond
	cfg.Tenants = map[string]TenantConfig{tenant: {Language: "zh"}}
	env := testEnv()
	env.Kafka, env.Topics.Signals = kcfg, topic

	cl, err := kafkaconn.NewClient(kcfg, kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := kafkaconn.EnsureTopics(ctx, cl, kcfg, topic); err != nil {
		t.Fatal(err)
	}
	produce := func(value []byte) {
		t.Helper()
		rec := testSigner.Record(topic, []byte(tenant), value)
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	encode := func(s *schemas.Signal) []byte {
		t.Helper()
		b, err := schemas.EncodeSignal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	svc, err := New(cfg, env)

	itest.RunService(t, svc, err)

	now := time.Now().UTC()
	produce([]byte(`{"not": "a signal"`))
	produce(encode(tierSignal(tenant, 70, 90, now)))

	list := func() []amAlert { return amAlerts(t, am, `tenant="`+tenant+`"`) }
	var got []amAlert
	itest.Eventually(t, 30*time.Second, "the alert in Alertmanager", func() bool { got = list(); return len(got) == 1 })
	if got[0].Labels["severity"] != "warning" || got[0].Labels["tier"] != "90" || got[0].Labels["alertname"] != "SluiceQuotaTier" {
		t.Errorf("labels %v", got[0].Labels)
	}
	if !strings.Contains(got[0].Annotations["summary"], "月度 Token 配额已用 90%") {
		t.Errorf("summary %q is not the tenant's language", got[0].Annotations["summary"])
	}

	sigSeq++
	produce(encode(&schemas.Signal{ID: "reset" + tenant, Kind: schemas.SignalPeriodReset, Time: now, Tenant: tenant, Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth}))
	itest.Eventually(t, 30*time.Second, "the alert resolved", func() bool { return len(list()) == 0 })

	mfs, err := env.Metrics.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "sluice_alerter_signals_invalid_total" {
			found = true
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 1 {
				t.Errorf("invalid signals counted %v, want the one poison record", v)
			}
		}
	}
	if !found {
		t.Error("sluice_alerter_signals_invalid_total not registered")
	}
}
