package enforcer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// TestForgedAdminRecordsAreRefused: anyone who can produce to the admin
// topic could lift a blacklist with a tombstone of its key, or block a
// tenant with a blacklist of their own. A running enforcer refuses and
// counts a lift that is unsigned, signed with a guessed secret, carries
// the genuine signature of another record, or is a genuine signal's
// signature (another stream), and a forged blacklist; a restarted one,
// reading the whole topic, refuses them again. The admin API's own
// actions, signed with the shared key, take effect.
func TestForgedAdminRecordsAreRefused(t *testing.T) {
	a := newAdminTest(t)
	kc, rc, cfg := a.env.Kafka, a.env.Redis, a.cfg
	ctx := context.Background()
	ch := startChecker(t, rc, cfg.KeyPrefix, 10*time.Second)
	signer := itest.Signer(t, a.env.SignalAuth)

	cl, reg, stop := a.start(t)

	tenant, victim := itest.Unique(t, "fraud-"), itest.Unique(t, "victim-")
	if _, err := cl.Blacklist(ctx, adminapi.Request{Tenant: tenant, Reason: "fraud", ExpiresIn: "1h"}); err != nil {
		t.Fatal(err)
	}
	blacklisted := func(tn string) bool {
		d := ch.Check(tn, "gpt-4o", "")
		return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindBlacklist
	}
	itest.Eventually(t, within, "blacklist enforced", func() bool { return blacklisted(tenant) })

	prod, err := kafkaconn.NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	adminSchema := []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaAdminV1)}}
	lift := (&schemas.AdminState{Kind: schemas.AdminBlacklist, Tenant: tenant, Model: flags.AllModels}).Key()
	block := &schemas.AdminState{Kind: schemas.AdminBlacklist, Tenant: victim, Model: flags.AllModels, Reason: "forged",
		Until: time.Now().Add(time.Hour), Time: time.Now()}
	blockValue, err := schemas.EncodeAdminState(block)
	if err != nil {
		t.Fatal(err)
	}
	forger, err := signalauth.Open(signalauth.Config{Keys: []string{"test:" + strings.Repeat("f", 64)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	genuine := signer.For(signalauth.AdminActions).Record(a.env.Topics.Admin, []byte(block.Key()), blockValue)
	forged := []*kgo.Record{
		// 1. An unsigned tombstone, as any Kafka client would produce it.
		{Key: []byte(lift), Headers: adminSchema},
		// 2. Signed under the right key id with a guessed secret.
		forger.For(signalauth.AdminActions).Record(a.env.Topics.Admin, []byte(lift), nil),
		// 3. The genuine signature of another admin record, copied.
		{Key: []byte(lift), Headers: genuine.Headers},
		// 4. A genuine signature of the signals stream under the shared key.
		signer.Record(a.env.Topics.Admin, []byte(lift), nil),
		// 5. An unsigned blacklist of someone else.
		{Key: []byte(block.Key()), Value: blockValue, Headers: adminSchema},
	}
	for _, r := range forged {
		r.Topic = a.env.Topics.Admin
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// The admin API answers once its replica applied the action, and the
	// topic has one partition: after this trip, the forged records were read.
	if _, err := cl.Trip(ctx, adminapi.Request{Tenant: tenant, Model: "sentinel", Reason: "sentinel", ExpiresIn: "1h"}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "the sentinel trip enforced", func() bool { return ch.Check(tenant, "sentinel", "").Outcome == checker.Refused })
	check := func(when string, reg *prometheus.Registry) {
		t.Helper()
		if n := itest.CounterValue(t, reg, "sluice_enforcer_admin_records_total", map[string]string{"result": "unauthenticated"}); n != float64(len(forged)) {
			t.Errorf("%s: unauthenticated admin records %v, want %d", when, n, len(forged))
		}
		if !blacklisted(tenant) {
			t.Fatalf("%s: a forged admin record lifted the blacklist", when)
		}
		if blacklisted(victim) || !ch.Check(victim, "gpt-4o", "").Allowed() {
			t.Fatalf("%s: a forged admin record blacklisted a tenant", when)
		}
	}
	check("running", reg)

	// A restart reads the whole topic again.
	stop()
	cl, reg, _ = a.start(t)
	itest.Eventually(t, within, "restarted enforcer read the admin topic", func() bool {
		return itest.CounterValue(t, reg, "sluice_enforcer_admin_records_total", map[string]string{"result": "applied"}) >= 2
	})
	check("restarted", reg)

	// The lift through the admin API, signed, lifts it.
	if _, err := cl.Unblacklist(ctx, adminapi.Request{Tenant: tenant, Reason: "cleared"}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "a signed lift enforced", func() bool { return !blacklisted(tenant) })
}
