// Package controlplanetest writes admin API records the way the enforcer
// does, for the tests of the services that follow the admin topic.
package controlplanetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
)

// ProduceTenant creates topic compacted (deleted when t ends) and produces
// to it the record of tenant, with body (JSON) as its policy section,
// signed with sa as the enforcer's admin API signs it.
func ProduceTenant(t testing.TB, kc kafkaconn.Config, sa signalauth.Config, topic, tenant, body string) {
	t.Helper()
	prod := itest.CompactingTopic(t, kc, topic)
	if err := prod.ProduceSync(context.Background(), TenantRecords(t, sa, topic, tenant, body)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// TenantRecords are the records of tenant, version 1, with body (JSON) as
// its policy section, signed with sa for topic.
func TenantRecords(t testing.TB, sa signalauth.Config, topic, tenant, body string) []*kgo.Record {
	t.Helper()
	stamp := adminapi.MadeBy("ops", time.Now().UTC())
	stamp.Version = 1
	recs, err := controlplane.NewLog(itest.Signer(t, sa)).Records(topic, &controlplane.Record{Kind: controlplane.KindTenant, Request: "r1",
		Section: &controlplane.Section{Section: adminapi.Section{Name: tenant, Body: json.RawMessage(body), Stamp: stamp}}})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
