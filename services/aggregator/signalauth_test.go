package aggregator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// testSignalAuth is the key ring of the services these tests run: the
// aggregator signs with it, the enforcer of the re-evaluation tests
// verifies with it.
var testSignalAuth = signalauth.Config{Keys: []string{"test:" + strings.Repeat("a", 64)}}

// TestSignalsAreSigned: every signal the aggregator produces verifies
// under the shared key, and not under another.
func TestSignalsAreSigned(t *testing.T) {
	e := integrationEnv(t, "tenants:\n  acme:\n    models:\n      \"*\": {daily_tokens: 1000}\n")
	runInProcess(t, e, e.ch.Addr, nil)
	produce(t, e, []schemas.UsageEvent{{ID: "e1", Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 800}})

	cl, err := kafkaconn.NewClient(e.kafka, kgo.ConsumeTopics(e.signals), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	verifier := itest.Signer(t, testSignalAuth)
	other := itest.Signer(t, signalauth.Config{Keys: []string{"test:" + strings.Repeat("b", 64)}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) == 0 && ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	if len(got) == 0 {
		t.Fatal("no signal within 60s")
	}
	for _, r := range got {
		if err := verifier.Verify(r); err != nil {
			t.Errorf("signal %s: %v", r.Value, err)
		}
		if err := other.Verify(r); err == nil {
			t.Errorf("signal %s verifies under another secret", r.Value)
		}
	}
}
