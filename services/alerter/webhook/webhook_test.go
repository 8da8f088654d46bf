package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/channel/channeltest"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/message/messagetest"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

const (
	secret  = "s3cret-s3cret-s3cret-0123456789"
	replay  = 5 * time.Minute
	whsecPK = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // base64 of 24 bytes
)

// receiver stands in for a customer's endpoint: it verifies every
// delivery with Verify, the function docs/webhooks.md hands receivers, and
// checks the body against the published JSON Schema.
type receiver struct {
	t      *testing.T
	secret string
	schema *jsonschema.Schema
	mu     sync.Mutex
	fail   channeltest.Outage // answer 503 to this many requests first
	got    []delivery
	errs   []string
}

type delivery struct {
	header http.Header
	body   []byte
	p      Payload
}

func newReceiver(t *testing.T, secret string) (*receiver, *httptest.Server) {
	rc := &receiver{t: t, secret: secret, schema: compileSchema(t)}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, srv
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := Verify(rc.secret, r.Header, body, time.Now(), replay); err != nil {
		rc.errs = append(rc.errs, err.Error())
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		rc.errs = append(rc.errs, "method or content type: "+r.Method+" "+r.Header.Get("Content-Type"))
		http.Error(w, "bad", http.StatusBadRequest)
		return
	}
	if err := validate(rc.schema, body); err != nil {
		rc.errs = append(rc.errs, "schema: "+err.Error())
		http.Error(w, "bad", http.StatusBadRequest)
		return
	}
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil || p.ID != r.Header.Get(HeaderID) {
		rc.errs = append(rc.errs, "body id differs from webhook-id")
		http.Error(w, "bad", http.StatusBadRequest)
		return
	}
	rc.got = append(rc.got, delivery{header: r.Header.Clone(), body: body, p: p})
	if rc.fail.Answer(w, http.StatusServiceUnavailable) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) deliveries() ([]delivery, []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got), slices.Clone(rc.errs)
}

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := schemas.JSONSchema(schemas.JSONSchemaAlertWebhookV1)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	const id = "https://github.com/sluicehq/sluice/schemas/jsonschema/alert-webhook.v1.json"
	if err := c.AddResource(id, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(id)
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

func validate(sch *jsonschema.Schema, body []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}

func renderer(t *testing.T) *message.Renderer {
	return messagetest.Renderer(t, message.Links{Dashboard: "https://grafana.example/d/sluice?tenant={tenant}"})
}

var (
	t0      = time.Date(2031, 3, 14, 9, 26, 53, 589793238, time.UTC)
	predict = t0.Add(20 * time.Minute)
)

func tierAlert(tenant string, tier int) alert.Alert {
	sev := alert.SeverityWarning
	if tier >= 100 {
		sev = alert.SeverityCritical
	}
	return alert.Alert{Key: alert.Key{Tenant: tenant, Model: "gpt-4o", Period: "month", Quota: "monthly_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: sev, Tier: tier, Used: 900000, Limit: 1000000, Rate: 1234.5, Unit: "tokens", Mode: "hard",
		PeriodEnd: time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC), StartsAt: t0, Language: "en", Reason: "usage crossed <90%> & [more]",
		PredictedExhaustion: &predict, Attributes: map[string]string{"prediction_basis": "rates"}}
}

func newSender(t *testing.T, url, secret, previous, tenant string) *Sender {
	t.Helper()
	s, err := New(url, secret, previous, tenant, renderer(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDeliveryIsSignedAndMatchesTheDocumentedFormat posts one alert and
// checks, at a receiver that verifies as docs/webhooks.md says, every
// header and every field against the alert it came from.
func TestDeliveryIsSignedAndMatchesTheDocumentedFormat(t *testing.T) {
	rc, srv := newReceiver(t, secret)
	s := newSender(t, srv.URL+"/hooks/sluice?token=abc", secret, "", "")
	a := tierAlert("acme", 90)
	if err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{a}}); err != nil {
		t.Fatal(err)
	}
	got, errs := rc.deliveries()
	if len(errs) > 0 || len(got) != 1 {
		t.Fatalf("deliveries %d, refused: %v", len(got), errs)
	}
	d := got[0]
	if ua := d.header.Get("User-Agent"); ua != UserAgent {
		t.Errorf("User-Agent %q", ua)
	}
	if sigs := strings.Fields(d.header.Get(HeaderSignature)); len(sigs) != 1 || !strings.HasPrefix(sigs[0], "v1,") {
		t.Errorf("webhook-signature %q: want one v1 entry", d.header.Get(HeaderSignature))
	}
	p := d.p
	if p.Schema != Schema || p.Status != alert.StatusFiring || p.Incident || len(p.Events) != 1 || p.ID != p.Events[0].ID ||
		p.Title != "[warning] acme: monthly_tokens quota at 90%" || !strings.Contains(p.Text, "used 900,000 of 1,000,000 tokens (90.0%)") {
		t.Fatalf("envelope %+v", p)
	}
	e := p.Events[0]
	wantEnd := time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC)
	want := Event{
		ID: EventID(&a), Type: "quota.tier_crossed", Status: alert.StatusFiring, Severity: "warning",
		Rule: alert.RuleQuotaTier, AlertName: "SluiceQuotaTier", Tenant: "acme", Model: "gpt-4o", Period: "month", Quota: "monthly_tokens",
		Tier: 90, Used: 900000, Limit: 1000000, Percent: 90, Unit: "tokens", RatePerMinute: 1234.5, Mode: "hard",
		PredictedExhaustion: &predict, PeriodEnd: &wantEnd, StartsAt: t0,
		Reason:       "usage crossed <90%> & [more]",
		Summary:      "acme/gpt-4o: monthly_tokens quota at 90%",
		Description:  "Tenant acme, model gpt-4o, period month: used 900,000 of 1,000,000 tokens (90.0%), rate 1234.50 tokens/min, runs out at 2031-03-14 09:46 UTC. usage crossed <90%> & [more]",
		DashboardURL: "https://grafana.example/d/sluice?tenant=acme",
		Labels: map[string]string{"alertname": "SluiceQuotaTier", "tenant": "acme", "model": "gpt-4o", "severity": "warning",
			"source": "sluice", "period": "month", "quota": "monthly_tokens", "tier": "90"},
		Attributes: map[string]string{"prediction_basis": "rates"},
	}
	if !reflect.DeepEqual(e, want) {
		gotJSON, _ := json.MarshalIndent(e, "", " ")
		wantJSON, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("event\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	// The wire form: times in UTC with their nanoseconds, absent fields
	// left out rather than zero.
	var raw map[string]any
	_ = json.Unmarshal(d.body, &raw)
	ev := raw["events"].([]any)[0].(map[string]any)
	if ev["starts_at"] != "2031-03-14T09:26:53.589793238Z" || ev["ends_at"] != nil || ev["variant"] != nil || ev["runbook_url"] != nil {
		t.Errorf("wire event %v", ev)
	}
}

// TestEveryRuleAndQuotaHasADocumentedType: a notification whose type is
// not in the schema's enum would fail a receiver that validates.
func TestEveryRuleAndQuotaHasADocumentedType(t *testing.T) {
	rc, srv := newReceiver(t, secret)
	s := newSender(t, srv.URL, secret, "", "")
	var sent []alert.Alert
	for _, quota := range []string{"monthly_tokens", "budget"} {
		for _, tier := range []int{70, 100, 120} {
			a := tierAlert("acme", tier)
			a.Key.Quota = quota
			if quota == "budget" {
				a.Unit = "currency"
			}
			sent = append(sent, a)
		}
		a := tierAlert("acme", 0)
		a.Key.Rule, a.Key.Quota, a.Tier = alert.RuleExhaustionPredicted, quota, 0
		sent = append(sent, a)
	}
	for _, r := range []alert.Rule{alert.RuleRateExceeded, alert.RuleBreakerOpen, alert.RuleAnomaly, alert.RuleReconciliationDrift} {
		a := tierAlert("acme", 0)
		a.Key.Rule, a.Tier, a.Limit = r, 0, 0
		if r == alert.RuleBreakerOpen || r == alert.RuleAnomaly {
			a.Key.Quota, a.Key.Period, a.Key.Variant = "", "", "error_ratio"
		}
		sent = append(sent, a)
	}
	// Each resolved too.
	for _, a := range slices.Clone(sent) {
		a.Status, a.EndsAt = alert.StatusResolved, t0.Add(time.Hour)
		sent = append(sent, a)
	}
	types := map[string]bool{}
	for _, a := range sent {
		if err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{a}}); err != nil {
			t.Fatalf("%v: %v", a.Key, err)
		}
		types[EventType(&a)] = true
	}
	got, errs := rc.deliveries()
	if len(errs) > 0 || len(got) != len(sent) {
		t.Fatalf("%d of %d delivered; refused: %v", len(got), len(sent), errs)
	}
	if want := slices.Sorted(slices.Values(EventTypes)); !slices.Equal(slices.Sorted(maps.Keys(types)), want) {
		t.Errorf("types sent %v, want every documented type %v", slices.Sorted(maps.Keys(types)), want)
	}
	// The schema's enum is EventTypes.
	var doc struct {
		Defs struct {
			Event struct {
				Properties struct {
					Type struct {
						Enum []string `json:"enum"`
					} `json:"type"`
				} `json:"properties"`
			} `json:"event"`
		} `json:"$defs"`
	}
	b, _ := schemas.JSONSchema(schemas.JSONSchemaAlertWebhookV1)
	if err := json.Unmarshal(b, &doc); err != nil || !slices.Equal(doc.Defs.Event.Properties.Type.Enum, EventTypes) {
		t.Errorf("schema enum %v, EventTypes %v (%v)", doc.Defs.Event.Properties.Type.Enum, EventTypes, err)
	}
	for _, d := range got {
		if e := d.p.Events[0]; e.Status == alert.StatusResolved && (e.EndsAt == nil || !e.EndsAt.Equal(t0.Add(time.Hour))) {
			t.Errorf("resolved event without ends_at: %+v", e)
		}
	}
}

// TestGoTypesHaveTheSchemasFields keeps the Go types and the published
// schema from drifting apart: same fields, same required ones.
func TestGoTypesHaveTheSchemasFields(t *testing.T) {
	type object struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	var doc struct {
		object
		Defs struct {
			Event object `json:"event"`
		} `json:"$defs"`
	}
	b, _ := schemas.JSONSchema(schemas.JSONSchemaAlertWebhookV1)
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		typ reflect.Type
		obj object
	}{{reflect.TypeFor[Payload](), doc.object}, {reflect.TypeFor[Event](), doc.Defs.Event}} {
		var fields, required []string
		for f := range c.typ.Fields() {
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields = append(fields, name)
			if !strings.Contains(opts, "omit") {
				required = append(required, name)
			}
		}
		if got, want := slices.Sorted(slices.Values(fields)), slices.Sorted(maps.Keys(c.obj.Properties)); !slices.Equal(got, want) {
			t.Errorf("%s fields %v, schema properties %v", c.typ, got, want)
		}
		if got, want := slices.Sorted(slices.Values(required)), slices.Sorted(slices.Values(c.obj.Required)); !slices.Equal(got, want) {
			t.Errorf("%s always-present fields %v, schema's required %v", c.typ, got, want)
		}
	}
}

// TestIDsAreStableForAStateChangeAndDifferForAnother: the ids come from
// what the alerter persists, so the alert as restored from the state topic
// (JSON, as engine.Record stores it) has the same id; an escalation, a
// resolution or a later firing gets another.
func TestIDsAreStableForAStateChangeAndDifferForAnother(t *testing.T) {
	a := tierAlert("acme", 90)
	a.StartsAt = t0.In(time.FixedZone("CST", 8*3600)) // the engine's clock may not be UTC
	b, _ := json.Marshal(a)
	var restored alert.Alert
	if err := json.Unmarshal(b, &restored); err != nil {
		t.Fatal(err)
	}
	if EventID(&a) != EventID(&restored) {
		t.Fatal("the id changed through the persisted form")
	}
	escalated := tierAlert("acme", 100)
	resolved := a
	resolved.Status, resolved.EndsAt = alert.StatusResolved, t0.Add(time.Hour)
	later := a
	later.StartsAt = t0.Add(24 * time.Hour)
	other := tierAlert("acme-2", 90)
	ids := map[string]bool{}
	for _, x := range []alert.Alert{a, escalated, resolved, later, other} {
		ids[EventID(&x)] = true
	}
	if len(ids) != 5 {
		t.Fatalf("%d distinct ids for 5 state changes", len(ids))
	}
	// An incident's delivery id is a function of its events.
	s := newSender(t, "http://127.0.0.1:1", secret, "", "")
	m := alert.Message{Alerts: []alert.Alert{tierAlert("t1", 90), tierAlert("t2", 90)}}
	p1, err1 := s.Payload(&m)
	p2, err2 := s.Payload(&m)
	if err1 != nil || err2 != nil || p1.ID != p2.ID || !p1.Incident || p1.ID == p1.Events[0].ID || p1.ID == p1.Events[1].ID {
		t.Fatalf("incident ids %v %v (%v %v)", p1, p2, err1, err2)
	}
}

// TestRetriesRepeatTheIdempotencyKey runs the sender behind the alerter's
// dispatcher against a receiver that is down for two attempts: the third
// succeeds, and all three carry the same webhook-id and body.
func TestRetriesRepeatTheIdempotencyKey(t *testing.T) {
	rc, srv := newReceiver(t, secret)
	rc.fail = 2
	m, err := notify.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	d := notify.NewDispatcher(slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	cfg := Kind.Delivery
	cfg.InitialBackoff, cfg.MaxBackoff = time.Millisecond, 5*time.Millisecond
	if err := d.Set("webhook:acme", newSender(t, srv.URL, secret, "", ""), cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx, 10*time.Second); close(done) }()
	defer func() { cancel(); <-done }()
	d.Deliver("webhook:acme", alert.Message{Alerts: []alert.Alert{tierAlert("acme", 90)}})
	itest.Eventually(t, 30*time.Second, "the delivery accepted on the third attempt", func() bool {
		return testutil.ToFloat64(m.Sent.WithLabelValues("webhook:acme")) == 1
	})
	got, errs := rc.deliveries()
	if len(got) != 3 || len(errs) > 0 || testutil.ToFloat64(m.Retries.WithLabelValues("webhook:acme")) != 2 {
		t.Fatalf("%d attempts, refused %v", len(got), errs)
	}
	for _, g := range got[1:] {
		if g.header.Get(HeaderID) != got[0].header.Get(HeaderID) || !bytes.Equal(g.body, got[0].body) {
			t.Fatalf("a retry changed the delivery: %s vs %s", g.body, got[0].body)
		}
	}
}

// TestRotationSignsWithBothSecrets: during a rotation a receiver holding
// either secret verifies every delivery.
func TestRotationSignsWithBothSecrets(t *testing.T) {
	for _, receiverSecret := range []string{secret, whsecPK} {
		rc, srv := newReceiver(t, receiverSecret)
		s := newSender(t, srv.URL, whsecPK, secret, "")
		if err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{tierAlert("acme", 90)}}); err != nil {
			t.Fatalf("receiver with %.8s…: %v", receiverSecret, err)
		}
		if got, errs := rc.deliveries(); len(got) != 1 || len(strings.Fields(got[0].header.Get(HeaderSignature))) != 2 {
			t.Fatalf("receiver with %.8s…: %d deliveries, refused %v", receiverSecret, len(got), errs)
		}
	}
}

// TestVerifyRefusesForgeriesAndReplays exercises the receivers' function
// on what an attacker can send.
func TestVerifyRefusesForgeriesAndReplays(t *testing.T) {
	key, _ := Key(secret)
	body := []byte(`{"schema":"sluice.alerts.v1","id":"0123456789abcdef0123456789abcdef"}`)
	now := time.Unix(1900000000, 0)
	header := func(id string, ts int64, sig string) http.Header {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, itoa(ts))
		h.Set(HeaderSignature, sig)
		return h
	}
	id := "0123456789abcdef0123456789abcdef"
	good := Sign(key, id, now.Unix(), body)
	if err := Verify(secret, header(id, now.Unix(), good), body, now, replay); err != nil {
		t.Fatalf("a good delivery refused: %v", err)
	}
	if err := Verify(secret, header(id, now.Unix(), "v1,AAAA "+good), body, now.Add(replay), replay); err != nil {
		t.Fatalf("a good delivery among other signatures, at the window's edge, refused: %v", err)
	}
	wrongKey, _ := Key("another-secret-of-enough-bytes")
	noSig, replayed, badTS := "no valid signature", "outside the replay window", "not Unix seconds"
	cases := map[string]struct {
		err  error
		want string
	}{
		"tampered body":   {Verify(secret, header(id, now.Unix(), good), append(bytes.Clone(body), ' '), now, replay), noSig},
		"other id":        {Verify(secret, header("ffffffffffffffffffffffffffffffff", now.Unix(), good), body, now, replay), noSig},
		"wrong secret":    {Verify(secret, header(id, now.Unix(), Sign(wrongKey, id, now.Unix(), body)), body, now, replay), noSig},
		"other timestamp": {Verify(secret, header(id, now.Unix()+1, good), body, now, replay), noSig},
		"replayed later":  {Verify(secret, header(id, now.Unix(), good), body, now.Add(replay+time.Second), replay), replayed},
		"from the future": {Verify(secret, header(id, now.Unix()+400, Sign(key, id, now.Unix()+400, body)), body, now, replay), replayed},
		"no signature":    {Verify(secret, header(id, now.Unix(), ""), body, now, replay), "missing"},
		"v2 scheme":       {Verify(secret, header(id, now.Unix(), "v2,"+strings.TrimPrefix(good, "v1,")), body, now, replay), noSig},
		"bad timestamp":   {verifyErr(secret, header(id, now.Unix(), good), HeaderTimestamp, "soon", body, now), badTS},
	}
	for name, c := range cases {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, c.err, c.want)
		}
	}
}

// verifyErr is Verify of header with key set to value.
func verifyErr(secret string, header http.Header, key, value string, body []byte, now time.Time) error {
	header.Set(key, value)
	return Verify(secret, header, body, now, replay)
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestABoundChannelOnlyCarriesItsTenant: a channel with tenant set sends
// that tenant's alerts and refuses, permanently, a notification with none
// of them, so that a routing mistake never reaches a tenant's receiver.
func TestABoundChannelOnlyCarriesItsTenant(t *testing.T) {
	rc, srv := newReceiver(t, secret)
	s := newSender(t, srv.URL, secret, "", "acme")
	err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{tierAlert("globex", 90)}})
	if !notify.IsPermanent(err) || !errors.Is(err, errForeign) {
		t.Fatalf("another tenant's alert: %v", err)
	}
	mixed := alert.Message{Alerts: []alert.Alert{tierAlert("globex", 90), tierAlert("acme", 90), tierAlert("initech", 90)}}
	if err := s.Send(context.Background(), mixed); err != nil {
		t.Fatal(err)
	}
	got, _ := rc.deliveries()
	if len(got) != 1 || len(got[0].p.Events) != 1 || got[0].p.Events[0].Tenant != "acme" || got[0].p.Incident ||
		strings.Contains(string(got[0].body), "globex") || strings.Contains(string(got[0].body), "initech") {
		t.Fatalf("deliveries %+v", got)
	}
}

// TestStatusCodesMapToRetryPolicy: 2xx accepted, 5xx and 429 retried,
// other 4xx given up (the receiver refuses this request for good).
func TestStatusCodesMapToRetryPolicy(t *testing.T) {
	for _, c := range []struct {
		status    int
		ok        bool
		permanent bool
	}{{200, true, false}, {202, true, false}, {204, true, false}, {500, false, false}, {503, false, false}, {429, false, false},
		{400, false, true}, {401, false, true}, {410, false, true}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(c.status) }))
		s := newSender(t, srv.URL, secret, "", "")
		err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{tierAlert("acme", 90)}})
		srv.Close()
		if (err == nil) != c.ok || notify.IsPermanent(err) != c.permanent {
			t.Errorf("status %d: err %v, permanent %v", c.status, err, notify.IsPermanent(err))
		}
	}
}

// TestKindChecksSettingsWithoutQuotingSecrets: each error names its
// setting, and none repeats the secret or the URL (a refused policy reload
// is logged).
func TestKindChecksSettingsWithoutQuotingSecrets(t *testing.T) {
	if err := Kind.Check(channel.Settings{"url": "https://hooks.example/x?token=TOKEN4711", "secret": secret}); err != nil {
		t.Fatalf("good settings: %v", err)
	}
	if err := Kind.Check(channel.Settings{"url": "https://hooks.example/x", "secret": whsecPK, "previous_secret": secret, "tenant": "acme"}); err != nil {
		t.Fatalf("good settings: %v", err)
	}
	for _, c := range []struct {
		s    channel.Settings
		want []string
	}{
		{channel.Settings{"url": "https://hooks.example/x"}, []string{"secret: is required"}},
		{channel.Settings{"url": "hooks.example/x?token=TOKEN4711", "secret": "SHORTSECRET"}, []string{"url: has no scheme", "secret: a key of 11 bytes is too short"}},
		{channel.Settings{"url": "https://hooks.example/x", "secret": "whsec_!!SECRETSECRETSECRET"}, []string{"secret: the part after whsec_ is not standard base64"}},
		{channel.Settings{"url": "https://hooks.example/x", "secret": secret, "previous_secret": "OLDSECRET"}, []string{"previous_secret: a key of 9 bytes"}},
		{channel.Settings{"url": "https://hooks.example/x", "secret": secret, "tenant": "no spaces"}, []string{"tenant:"}},
		{channel.Settings{"webhook": "https://hooks.example/x", "secret": secret}, []string{"webhook: unknown setting", "url: "}},
	} {
		err := Kind.Check(c.s)
		if err == nil {
			t.Errorf("%v accepted", c.s)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want %q", c.s, err, w)
			}
		}
		for _, leak := range []string{"TOKEN4711", "SHORTSECRET", "SECRETSECRET", "OLDSECRET"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("error quotes a credential: %v", err)
			}
		}
		var se *policy.SettingError
		if !errors.As(err, &se) {
			t.Errorf("%v: not a SettingError, so the policy cannot point at its line", err)
		}
	}
}

// TestDocsCarryTheVerifyFunction: docs/webhooks.md gives receivers Verify
// to copy; it must be this one, which the tests above exercise.
func TestDocsCarryTheVerifyFunction(t *testing.T) {
	src, err := os.ReadFile("verify.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	start := bytes.Index(src, []byte("func Verify("))
	if start < 0 || !bytes.Contains(doc, src[start:]) {
		t.Fatal("docs/webhooks.md does not carry verify.go's Verify verbatim; copy it from func Verify( to the end of the file")
	}
	imports := src[bytes.Index(src, []byte("import (")) : bytes.Index(src, []byte(")\n"))+2]
	if !bytes.Contains(doc, imports) {
		t.Fatal("docs/webhooks.md does not carry verify.go's imports")
	}
	// The example delivery is valid against the schema.
	_, example, ok := bytes.Cut(doc, []byte("```json\n"))
	example, _, _ = bytes.Cut(example, []byte("```"))
	if err := validate(compileSchema(t), example); !ok || err != nil {
		t.Fatalf("docs/webhooks.md's example delivery: %v", err)
	}
}

// TestTheDocumentedTestVector: docs/webhooks.md gives receivers a test
// vector; Verify accepts it and Sign produces it (a Python hmac computed
// the same value independently).
func TestTheDocumentedTestVector(t *testing.T) {
	const (
		sec  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwC2hRzmQy2vE="
		id   = "577a6aa1cf96ce71f96a131f195ae3b2"
		ts   = 1773480413
		body = `{"schema":"sluice.alerts.v1","id":"577a6aa1cf96ce71f96a131f195ae3b2"}`
		sig  = "v1,vZgKqV5aipNvrJWXOLB40Ng9zWEtPnNYp2Yuk+5Epz0="
	)
	key, err := Key(sec)
	if err != nil || Sign(key, id, ts, []byte(body)) != sig {
		t.Fatalf("Sign = %s (%v), want %s", Sign(key, id, ts, []byte(body)), err, sig)
	}
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, "1773480413")
	h.Set(HeaderSignature, sig)
	if err := Verify(sec, h, []byte(body), time.Unix(ts, 0), replay); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{sec, id, "1773480413", body, sig} {
		if !bytes.Contains(doc, []byte("`"+v+"`")) {
			t.Errorf("docs/webhooks.md lacks the test vector's %s", v)
		}
	}
}

// The whsec_ form decodes to its bytes, as Standard Webhooks libraries do.
func TestKeyForms(t *testing.T) {
	k, err := Key(whsecPK)
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(whsecPK, "whsec_"))
	if err != nil || !bytes.Equal(k, raw) {
		t.Fatalf("whsec_ key: %x, %v", k, err)
	}
	if k, err := Key(secret); err != nil || string(k) != secret {
		t.Fatalf("raw key: %v", err)
	}
}
