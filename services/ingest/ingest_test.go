package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
)

func TestMixedBatchAcceptsExactlyTheGoodEvents(t *testing.T) {
	inst := startIngest(t, nil)
	body := batchJSON(
		eventJSON("good-1", "acme"),
		`{"id":"bad-1","time":"2026-01-01T00:00:00Z","tenant":"acme","model":"m","prompt_tokens":-5,"completion_tokens":1,"colour":"red"}`,
		eventJSON("good-2", "beta"),
		`{"id":"bad-2","tenant":"has space","model":"m","prompt_tokens":1,"completion_tokens":1}`,
		eventJSON("good-3", "acme"),
	)
	a := post(t, inst.url, testKey, "application/json", []byte(body))
	if a.code != http.StatusMultiStatus || a.body.Accepted != 3 {
		t.Fatalf("answer %d %s, want 207 with 3 accepted", a.code, a.raw)
	}
	if len(a.body.Rejected) != 2 {
		t.Fatalf("rejected %+v, want bad-1 and bad-2", a.body.Rejected)
	}
	r1, r2 := a.body.Rejected[0], a.body.Rejected[1]
	if r1.Index != 1 || r1.ID != "bad-1" || len(r1.Errors) != 2 {
		t.Errorf("bad-1 rejection %+v: want index 1 and both reasons (prompt_tokens, colour)", r1)
	}
	if r2.Index != 3 || r2.ID != "bad-2" || len(r2.Errors) != 2 {
		t.Errorf("bad-2 rejection %+v: want index 3 and both reasons (time missing, tenant)", r2)
	}

	recs := itest.ReadTopic(t, inst.kafka, inst.topic)
	counts := idCounts(t, recs)
	if len(counts) != 3 || counts["good-1"] != 1 || counts["good-2"] != 1 || counts["good-3"] != 1 {
		t.Fatalf("topic holds %v, want good-1, good-2, good-3 once each", counts)
	}
	for _, r := range recs {
		if len(r.Headers) != 1 || r.Headers[0].Key != schemas.HeaderSchema || string(r.Headers[0].Value) != schemas.SchemaUsageV1 {
			t.Fatalf("record headers %v, want schema: %s", r.Headers, schemas.SchemaUsageV1)
		}
		var ev schemas.UsageEvent
		if err := eventjson.DecodeUsageEvent(r.Value, &ev); err != nil {
			t.Fatalf("record value does not decode as usage event v1: %v", err)
		}
	}

	// All bad: 400 with every rejection, nothing produced.
	a = post(t, inst.url, testKey, "application/x-ndjson", []byte(`{"id":"x"}`+"\n"+`not json`))
	if a.code != http.StatusBadRequest || len(a.body.Rejected) != 2 || a.body.Accepted != 0 {
		t.Fatalf("all-bad NDJSON: %d %s, want 400 with two rejections", a.code, a.raw)
	}
}

// Both ways to the broker keep the contract: requests that wait out the
// linger (small_request_max_events 0) and small requests on a producer of
// their own (16).
func TestDuplicateIDIsProducedOnce(t *testing.T) {
	for _, smallMax := range []int{0, 16} {
		t.Run(fmt.Sprintf("small_request_max_events=%d", smallMax), func(t *testing.T) {
			testDuplicateIDIsProducedOnce(t, smallMax)
		})
	}
}

func testDuplicateIDIsProducedOnce(t *testing.T, smallMax int) {
	inst := startIngest(t, func(c *Config) { c.SmallRequestMaxEvents = smallMax })
	ev := eventJSON("dup-1", "acme")
	for i, body := range []string{ev, ev, batchJSON(ev, eventJSON("other", "acme"), ev)} {
		a := post(t, inst.url, testKey, "", []byte(body))
		if a.code != http.StatusAccepted {
			t.Fatalf("request %d: %d %s", i, a.code, a.raw)
		}
		if i > 0 && a.body.Duplicates == 0 {
			t.Errorf("request %d: answer does not report duplicates: %s", i, a.raw)
		}
	}
	// CloudEvents carry the same id: also a duplicate.
	ce := fmt.Sprintf(`{"specversion":"1.0","type":"dev.sluice.usage.v1","source":"//gw","id":"dup-1","time":%q,"data":{"tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}}`,
		time.Now().UTC().Format(time.RFC3339))
	if a := post(t, inst.url, testKey, schemas.ContentTypeCloudEvents, []byte(ce)); a.code != http.StatusAccepted || a.body.Duplicates != 1 {
		t.Fatalf("CloudEvent duplicate: %d %s", a.code, a.raw)
	}
	counts := idCounts(t, itest.ReadTopic(t, inst.kafka, inst.topic))
	if counts["dup-1"] != 1 || counts["other"] != 1 || len(counts) != 2 {
		t.Fatalf("topic holds %v, want dup-1 and other exactly once", counts)
	}
}

// Small requests go to the small-request producer, with its own settings,
// and larger ones to the lingering producer: the records' batches carry
// each producer's codec (small_request_compression none, compression lz4).
// Each request's events share a tenant, so a partition and a batch: the
// producer leaves a batch uncompressed when lz4 would not shrink it, as
// for a lone record.
func TestSmallRequestsHaveTheirOwnProducer(t *testing.T) {
	inst := startIngest(t, func(c *Config) { c.SmallRequestMaxEvents = 3; c.SmallRequestCompression = "none" })
	small := batchJSON(eventJSON("small-1", "acme"), eventJSON("small-2", "acme"), eventJSON("small-3", "acme"))
	large := batchJSON(eventJSON("large-1", "beta"), eventJSON("large-2", "beta"), eventJSON("large-3", "beta"), eventJSON("large-4", "beta"))
	for _, body := range []string{small, large} {
		if a := post(t, inst.url, testKey, "", []byte(body)); a.code != http.StatusAccepted {
			t.Fatalf("%d %s", a.code, a.raw)
		}
	}
	recs := itest.ReadTopic(t, inst.kafka, inst.topic)
	if len(recs) != 7 {
		t.Fatalf("topic holds %d records, want 7", len(recs))
	}
	const none, lz4 = 0, 3 // Kafka's batch codec attribute
	for _, r := range recs {
		var ev struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatal(err)
		}
		want := uint8(none)
		if strings.HasPrefix(ev.ID, "large-") {
			want = lz4
		}
		if got := r.Attrs.CompressionType(); got != want {
			t.Errorf("%s: batch codec %d, want %d", ev.ID, got, want)
		}
	}
}

func TestAuthentication(t *testing.T) {
	inst := startIngest(t, nil)
	ev := []byte(eventJSON("auth-1", "acme"))
	for _, c := range []struct {
		key  string
		code int
	}{{"", 401}, {"wrong", 401}, {testKey + "x", 401}} {
		a := post(t, inst.url, c.key, "", ev)
		if a.code != c.code || strings.Contains(a.raw, "gw-") || strings.Contains(a.raw, sha(testKey)[:16]) {
			t.Errorf("key %q: %d %s, want %d naming no key", c.key, a.code, a.raw, c.code)
		}
	}
	// A key scoped to acme: another tenant alone is 403, mixed is 207.
	a := post(t, inst.url, testScopedKey, "", []byte(eventJSON("auth-2", "beta")))
	if a.code != http.StatusForbidden || len(a.body.Rejected) != 1 || a.body.Rejected[0].Errors[0].Field != "tenant" {
		t.Fatalf("scoped key, other tenant: %d %s, want 403 naming the tenant", a.code, a.raw)
	}
	a = post(t, inst.url, testScopedKey, "", []byte(batchJSON(eventJSON("auth-3", "acme"), eventJSON("auth-4", "beta"))))
	if a.code != http.StatusMultiStatus || a.body.Accepted != 1 || a.body.Rejected[0].ID != "auth-4" {
		t.Fatalf("scoped key, mixed tenants: %d %s, want 207 accepting auth-3", a.code, a.raw)
	}
	if a := post(t, inst.url, testKey, "", ev); a.code != http.StatusAccepted {
		t.Fatalf("valid key: %d %s", a.code, a.raw)
	}
}

func TestLimitsAndFormats(t *testing.T) {
	inst := startIngest(t, func(c *Config) { c.MaxBodyBytes = 4096; c.MaxEventsPerRequest = 5; c.InflightEvents = 100 })
	events := make([]string, 6)
	for i := range events {
		events[i] = eventJSON(fmt.Sprint("lim-", i), "acme")
	}
	a := post(t, inst.url, testKey, "", []byte(batchJSON(events...)))
	if a.code != http.StatusRequestEntityTooLarge || !strings.Contains(a.body.Error, "max_events_per_request = 5") {
		t.Errorf("6 events: %d %s, want 413 naming max_events_per_request", a.code, a.raw)
	}
	big := []byte(`[` + strings.Repeat(" ", 5000) + eventJSON("big", "acme") + `]`)
	a = post(t, inst.url, testKey, "", big)
	if a.code != http.StatusRequestEntityTooLarge || !strings.Contains(a.body.Error, "max_body_bytes = 4096") {
		t.Errorf("5 kB body: %d %s, want 413 naming max_body_bytes", a.code, a.raw)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(big)
	zw.Close()
	a = post(t, inst.url, testKey, "", z.Bytes(), "Content-Encoding", "gzip")
	if a.code != http.StatusRequestEntityTooLarge {
		t.Errorf("gzip body over the limit once decoded: %d %s, want 413", a.code, a.raw)
	}
	z.Reset()
	zw.Reset(&z)
	zw.Write([]byte(strings.Join(events[:5], "\n")))
	zw.Close()
	a = post(t, inst.url, testKey, "application/x-ndjson", z.Bytes(), "Content-Encoding", "gzip")
	if a.code != http.StatusAccepted || a.body.Accepted != 5 {
		t.Errorf("gzip NDJSON: %d %s, want 202 with 5 accepted", a.code, a.raw)
	}
	a = post(t, inst.url, testKey, "text/plain", []byte(events[0]))
	if a.code != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d %s, want 415", a.code, a.raw)
	}
	a = post(t, inst.url, testKey, "", []byte(`[`+events[0]))
	if a.code != http.StatusBadRequest || !strings.Contains(a.body.Error, "byte") {
		t.Errorf("unclosed array: %d %s, want 400 with the byte offset", a.code, a.raw)
	}
}

// TestBrokerDownNeverAnswers2xx cuts the connection to the broker while
// clients keep sending: requests that cannot be acknowledged get 503 with
// Retry-After; after the broker is back, every event a client got 2xx for
// is in the topic exactly once, retries included.
func TestBrokerDownNeverAnswers2xx(t *testing.T) {
	kc := itest.Kafka(t)
	proxy := itest.NewProxy(t, kc.Brokers[0])
	inst := startIngest(t, func(c *Config) {
		c.ProduceTimeout = 2 * time.Second
		c.DeliveryTimeout = 120 * time.Second
	}, proxyDialer(proxy))

	const clients, batches, perBatch = 4, 15, 20
	var (
		mu        sync.Mutex
		acked     = map[string]bool{}
		saw503    = 0
		badAnswer []string
	)
	var wg sync.WaitGroup
	cut := make(chan struct{})
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				if b == 3 && c == 0 {
					close(cut) // the first client triggers the outage part-way
				}
				ids := make([]string, perBatch)
				evs := make([]string, perBatch)
				for i := range ids {
					ids[i] = fmt.Sprintf("c%d-b%d-e%d", c, b, i)
					evs[i] = eventJSON(ids[i], fmt.Sprint("tenant-", i%5))
				}
				body := []byte(batchJSON(evs...))
				deadline := time.Now().Add(3 * time.Minute)
				for {
					a := post(t, inst.url, testKey, "", body)
					mu.Lock()
					switch a.code {
					case http.StatusAccepted:
						for _, id := range ids {
							acked[id] = true
						}
					case http.StatusServiceUnavailable:
						saw503++
						if a.retryAfter == "" {
							badAnswer = append(badAnswer, "503 without Retry-After")
						}
					default:
						badAnswer = append(badAnswer, fmt.Sprintf("%d %s", a.code, a.raw))
					}
					mu.Unlock()
					if a.code == http.StatusAccepted {
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("batch c%d-b%d not accepted within 3 minutes", c, b)
						return
					}
					time.Sleep(100 * time.Millisecond) // a gateway's back-off
				}
			}
		}()
	}
	<-cut
	proxy.Cut()
	itest.Eventually(t, 60*time.Second, "a 503 while the broker is unreachable", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return saw503 > 0
	})
	// While cut, readiness must say not ready.
	itest.Eventually(t, 30*time.Second, "readiness turning false", func() bool {
		resp, err := http.Get(inst.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	proxy.Restore()
	wg.Wait()
	if len(badAnswer) > 0 {
		t.Fatalf("unexpected answers: %v", badAnswer)
	}
	if len(acked) != clients*batches*perBatch {
		t.Fatalf("%d events acknowledged, want %d", len(acked), clients*batches*perBatch)
	}
	counts := idCounts(t, itest.ReadTopic(t, inst.kafka, inst.topic))
	for id := range acked {
		if counts[id] != 1 {
			t.Errorf("event %s got 2xx and is in the topic %d times, want exactly 1", id, counts[id])
		}
	}
	t.Logf("503 answers during the outage: %d", saw503)
}

// TestBudgetBoundsInflight: with the broker unreachable, once the in-flight
// budget is taken, further requests get 503 at once instead of queueing.
func TestBudgetBoundsInflight(t *testing.T) {
	kc := itest.Kafka(t)
	proxy := itest.NewProxy(t, kc.Brokers[0])
	inst := startIngest(t, func(c *Config) {
		c.InflightEvents = 10
		c.MaxEventsPerRequest = 10
		c.ProduceTimeout = 2 * time.Second
	}, proxyDialer(proxy))
	// Warm up the producer (metadata, producer id); a loaded machine may
	// need more than one produce_timeout for that.
	warm := []byte(eventJSON("warm", "acme"))
	itest.Eventually(t, 90*time.Second, "warm-up accepted", func() bool {
		return post(t, inst.url, testKey, "", warm).code == http.StatusAccepted
	})
	proxy.Cut()
	evs := make([]string, 10)
	for i := range evs {
		evs[i] = eventJSON(fmt.Sprint("budget-", i), "acme")
	}
	a := post(t, inst.url, testKey, "", []byte(batchJSON(evs...)))
	if a.code != http.StatusServiceUnavailable || !strings.Contains(a.body.Error, "produce_timeout") {
		t.Fatalf("first request while cut: %d %s, want 503 naming produce_timeout", a.code, a.raw)
	}
	// Its 10 records still wait for the broker, so the budget is full.
	a = post(t, inst.url, testKey, "", []byte(eventJSON("budget-next", "acme")))
	if a.code != http.StatusServiceUnavailable || !strings.Contains(a.body.Error, "inflight_events = 10") || a.retryAfter != "1" {
		t.Fatalf("request over the budget: %d %s (Retry-After %q), want 503 naming inflight_events", a.code, a.raw, a.retryAfter)
	}
	proxy.Restore()
	// After recovery the first request's retry is acknowledged, as duplicates.
	itest.Eventually(t, 90*time.Second, "retry accepted after the broker is back", func() bool {
		return post(t, inst.url, testKey, "", []byte(batchJSON(evs...))).code == http.StatusAccepted
	})
	counts := idCounts(t, itest.ReadTopic(t, inst.kafka, inst.topic))
	for i := range evs {
		if id := fmt.Sprint("budget-", i); counts[id] != 1 {
			t.Errorf("%s is in the topic %d times, want 1", id, counts[id])
		}
	}
}

func TestGracefulShutdown(t *testing.T) {
	inst := startIngest(t, nil)
	resp, err := http.Get(inst.url + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz before shutdown: %v %v", resp, err)
	}
	resp.Body.Close()
	if bad := inst.health.Ready(t.Context()); len(bad) != 0 {
		t.Fatalf("process readiness: %v", bad)
	}
	if err := inst.stop(); err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
	if _, err := http.Get(inst.url + "/readyz"); err == nil {
		t.Fatal("the listener still accepts after shutdown")
	}
}

// TestDedupKeyIsTenantIDAndEstimated: the settlement of an estimate reuses
// its id with estimated false and must reach the topic; another tenant's
// event with the same id must too. Only a real repeat is a duplicate.
func TestDedupKeyIsTenantIDAndEstimated(t *testing.T) {
	inst := startIngest(t, nil)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	estimate := fmt.Sprintf(`{"id":"req-9","time":%q,"tenant":"acme","model":"m","prompt_tokens":500,"completion_tokens":500,"estimated":true}`, now)
	settle := fmt.Sprintf(`{"id":"req-9","time":%q,"tenant":"acme","model":"m","prompt_tokens":120,"completion_tokens":40}`, now)
	other := fmt.Sprintf(`{"id":"req-9","time":%q,"tenant":"globex","model":"m","prompt_tokens":1,"completion_tokens":1}`, now)
	for i, body := range []string{estimate, settle, other} {
		a := post(t, inst.url, testKey, "", []byte(body))
		if a.code != http.StatusAccepted || a.body.Duplicates != 0 {
			t.Fatalf("event %d: %d %s, want 202 without duplicates", i, a.code, a.raw)
		}
	}
	if a := post(t, inst.url, testKey, "", []byte(settle)); a.code != http.StatusAccepted || a.body.Duplicates != 1 {
		t.Fatalf("repeated settlement: %d %s, want 202 with one duplicate", a.code, a.raw)
	}
	if n := idCounts(t, itest.ReadTopic(t, inst.kafka, inst.topic))["req-9"]; n != 3 {
		t.Fatalf("topic holds req-9 %d times, want 3 (estimate, settlement, globex)", n)
	}
}

// TestReservedModelRejected: model "*" used to get 202 and then be dropped
// by the aggregator; "@…" names collide with the flag hash's own fields.
// Both are refused at ingest, naming the field, and the valid event of the
// same batch still goes through.
func TestReservedModelRejected(t *testing.T) {
	inst := startIngest(t, nil)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	star := fmt.Sprintf(`{"id":"rm-1","time":%q,"tenant":"acme","model":"*","prompt_tokens":1,"completion_tokens":1}`, now)
	at := fmt.Sprintf(`{"id":"rm-2","time":%q,"tenant":"acme","model":"@v","prompt_tokens":1,"completion_tokens":1}`, now)
	a := post(t, inst.url, testKey, "", []byte(batchJSON(star, at, eventJSON("rm-3", "acme"))))
	if a.code != http.StatusMultiStatus || a.body.Accepted != 1 || len(a.body.Rejected) != 2 {
		t.Fatalf("%d %s, want 207 with rm-3 accepted and two rejections", a.code, a.raw)
	}
	for _, r := range a.body.Rejected {
		if len(r.Errors) != 1 || r.Errors[0].Field != "model" || !strings.Contains(r.Errors[0].Reason, "reserved") {
			t.Errorf("rejection %+v does not name model as reserved", r)
		}
	}
}

// TestFutureTimeBounded: an event further in the future than
// max_event_future is refused naming that limit; with the limit disabled,
// a time past 2105 is still refused by the schema (ClickHouse's DateTime
// would wrap it into the 1970s).
func TestFutureTimeBounded(t *testing.T) {
	ev := func(id string, at time.Time) string {
		return fmt.Sprintf(`{"id":%q,"time":%q,"tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`, id, at.Format(time.RFC3339Nano))
	}
	inst := startIngest(t, func(c *Config) { c.MaxEventFuture = 10 * time.Minute })
	a := post(t, inst.url, testKey, "", []byte(ev("ft-1", time.Now().Add(time.Hour))))
	if a.code != http.StatusBadRequest || len(a.body.Rejected) != 1 || len(a.body.Rejected[0].Errors) != 1 {
		t.Fatalf("an hour ahead: %d %s, want 400 with one rejection", a.code, a.raw)
	}
	if fe := a.body.Rejected[0].Errors[0]; fe.Field != "time" || !strings.Contains(fe.Reason, "services.ingest.max_event_future") || !strings.Contains(fe.Reason, "10m0s") {
		t.Errorf("rejection %+v does not name services.ingest.max_event_future and its value", fe)
	}

	open := startIngest(t, func(c *Config) { c.MaxEventFuture = 0 })
	for _, at := range []string{"2106-01-01T00:00:00Z", "2105-12-31T23:30:00-01:00", "2200-01-01T00:00:00Z"} {
		body := fmt.Sprintf(`{"id":"ft-2","time":%q,"tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`, at)
		a := post(t, open.url, testKey, "", []byte(body))
		if a.code != http.StatusBadRequest || len(a.body.Rejected) != 1 || a.body.Rejected[0].Errors[0].Field != "time" ||
			!strings.Contains(a.body.Rejected[0].Errors[0].Reason, "2105") {
			t.Errorf("time %s with max_event_future disabled: %d %s, want 400 naming the 2105 cap", at, a.code, a.raw)
		}
	}
}

// TestCanceledRequestAnswers503: a request cancelled while its events wait
// for the broker used to end with no answer written, which net/http sends
// as an empty 200 — taken by a sender (or a proxy's client) as success.
func TestCanceledRequestAnswers503(t *testing.T) {
	kc := itest.Kafka(t)
	proxy := itest.NewProxy(t, kc.Brokers[0])
	cfg := DefaultConfig()
	cfg.AllowAnonymous = true
	cfg.MaxEventAge = 0
	cfg.ProduceTimeout = time.Minute
	env := platform.Env{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Kafka: kc, Topics: itest.Topics(t)}
	s, err := newServer(context.Background(), cfg, env, proxyDialer(proxy))
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeProducers()
	proxy.Cut()
	defer proxy.Restore()

	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/events", strings.NewReader(eventJSON("cx-1", "acme")))
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { s.events(rec, req); close(done) }()
	// The event is claimed (in flight) once the handler is waiting for the
	// broker; then the client goes away.
	itest.Eventually(t, 30*time.Second, "the event to be in flight", func() bool { return s.budget.used.Load() == 1 })
	cancel()
	<-done
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("cancelled request answered %d %q, want 503 with Retry-After", rec.Code, rec.Body.String())
	}
	if n := testutil.ToFloat64(s.m.unavailable.WithLabelValues("canceled")); n != 1 {
		t.Fatalf("unavailable{canceled} = %v, want 1", n)
	}
}

// Plain requests take the hot route; a chunked one is handed to net/http
// and answered the same way, and so is every later request on its
// connection.
func TestHotRouteAndHandOffAnswerAlike(t *testing.T) {
	inst := startIngest(t, nil)
	if a := post(t, inst.url, testKey, "application/json", []byte(batchJSON(eventJSON("hot-1", "acme")))); a.code != http.StatusAccepted {
		t.Fatalf("plain request: %d %s", a.code, a.raw)
	}
	if n := inst.metric(t, "sluice_ingest_hot_route_requests_total"); n != 1 {
		t.Fatalf("hot route requests = %v after one plain request, want 1", n)
	}
	// A body of unknown length makes Go's client send it chunked.
	req, err := http.NewRequest(http.MethodPost, inst.url+"/v1/events", io.MultiReader(strings.NewReader(batchJSON(eventJSON("hot-2", "acme")))))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := (&http.Client{Transport: &http.Transport{}, Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || string(raw) != `{"accepted":1,"duplicates":0,"rejected":[]}`+"\n" {
		t.Fatalf("chunked request: %d %q", resp.StatusCode, raw)
	}
	if n := inst.metric(t, "sluice_ingest_hot_route_handoffs_total"); n != 1 {
		t.Fatalf("hand-offs = %v after one chunked request on a new connection, want 1", n)
	}
	if counts := idCounts(t, itest.ReadTopic(t, inst.kafka, inst.topic)); counts["hot-1"] != 1 || counts["hot-2"] != 1 {
		t.Fatalf("records by id: %v, want hot-1 and hot-2 once each", counts)
	}
}
