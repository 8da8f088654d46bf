package alerter

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

// testSignalAuth is the key ring of the pipelines these tests build
// (testEnv); testSigner signs the records they feed them.
var (
	testSignalAuth = signalauth.Config{Keys: []string{"test:" + strings.Repeat("a", 64)}}
	testSigner     = func() *signalauth.Auth {
		a, err := signalauth.Open(testSignalAuth, nil)
		if err != nil {
			panic(err)
		}
		return a
	}()
)

// signed is a signal record as the aggregator produces it.
func signed(t *testing.T, s *schemas.Signal) *kgo.Record {
	t.Helper()
	v, err := schemas.EncodeSignal(s)
	if err != nil {
		t.Fatal(err)
	}
	return testSigner.Record("", []byte(s.Tenant), v)
}

// TestForgedSignalsNotifyNoOne: a tier crossing produced by someone
// holding no key — unsigned, signed with a guessed secret, or carrying
// the genuine signature of another record — is refused and counted, and
// pages no one; the same signal signed with the shared key does.
func TestForgedSignalsNotifyNoOne(t *testing.T) {
	p, ding, sl := setup(t, nil)
	tenant := itest.Unique(t, "forged_")
	now := time.Now().UTC()
	value := func() []byte {
		v, err := schemas.EncodeSignal(tierSignal(tenant, 90, 100, now))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	forger, err := signalauth.Open(signalauth.Config{Keys: []string{"test:" + strings.Repeat("f", 64)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	genuine := signed(t, tierSignal(itest.Unique(t, "other_"), 0, 70, now))
	for _, r := range []*kgo.Record{
		{Key: []byte(tenant), Value: value(), Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaSignalsV1)}}},
		forger.Record("", []byte(tenant), value()),
		{Key: genuine.Key, Value: value(), Headers: genuine.Headers},
	} {
		p.handle(r, now)
	}
	if got := testutil.ToFloat64(p.unauthentic); got != 3 {
		t.Fatalf("unauthenticated count %v, want 3", got)
	}
	if got := testutil.ToFloat64(p.invalid); got != 0 {
		t.Errorf("invalid count %v: forged records are unauthenticated, not invalid", got)
	}
	// Channels deliver in order: once the sentinel is delivered, anything
	// the forged signals had queued would have been too.
	now = sentinel(t, p, now, ding, sl)
	for _, r := range []*receiver{ding, sl} {
		titles, _, _ := r.got()
		for _, title := range titles {
			if strings.Contains(title, tenant) {
				t.Fatalf("%s was notified of a forged signal: %q", r.kind, title)
			}
		}
	}

	// The same crossing, signed: notified.
	p.handle(signed(t, tierSignal(tenant, 90, 100, now)), now)
	for i := 0; i < 20; i++ {
		now = now.Add(10 * time.Second)
		p.engine.Tick(now)
	}
	itest.Eventually(t, 30*time.Second, "the signed signal notified", func() bool {
		titles, _, _ := ding.got()
		for _, title := range titles {
			if strings.Contains(title, tenant) {
				return true
			}
		}
		return false
	})
}
