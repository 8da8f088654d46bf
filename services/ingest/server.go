package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/httpserver/hotroute"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/ingest/apikey"
	"github.com/sluicehq/sluice/services/ingest/dedup"
	"github.com/sluicehq/sluice/services/ingest/payload"
)

// server is the events API: one per Run, or per test.
type server struct {
	cfg   Config
	log   *slog.Logger
	keys  *apikey.File // nil: anonymous access allowed
	kafka *kgo.Client
	// quick produces requests of at most small_request_max_events events,
	// with small_request_linger and small_request_compression. It is kafka
	// itself when those are kafka's own settings.
	quick  *kgo.Client
	dedup  *dedup.Window
	budget budget
	// decodeMem bounds the memory of every body being read and decoded
	// at once, in bytes (services.ingest.decode_memory_bytes).
	decodeMem budget
	m         *metrics
	owners    atomic.Uint64
	closing   atomic.Bool

	// usage serves GET /v1/usage; nil when usage_api is disabled.
	usage *usageapi.API
	// followUsage keeps the usage API's policy current until its context
	// ends.
	followUsage func(context.Context) error
	// hot serves POST /v1/events in its plain form; nil until Run starts
	// it, and when hot_route_max_body_bytes is 0.
	hot atomic.Pointer[hotroute.Server]

	bodies  sync.Pool // *bytes.Buffer
	batches sync.Pool // *payload.Batch
	header  []kgo.RecordHeader
	now     func() time.Time
	// tracer is nil when tracing is off; then the records carry only the
	// schema header.
	tracer trace.Tracer
}

// decodeCostFactor bounds what one decoded body byte costs in memory while
// a request is handled: the arrays the body is read into (less than twice
// its content, all of them charged as payload.ReadBody allocates them) and
// the decoder's one copy that the events' strings share (charged before
// decoding). With decodeOverhead (a gzip body's inflater) it is the least
// decode_memory_bytes may be per max_body_bytes, so that one largest
// request fits.
const decodeCostFactor = 3

// decodeOverhead is what a request is charged beyond its body's bytes:
// the gzip inflater (payload.InflaterBytes), rounded up.
const decodeOverhead = 64 << 10

// budget counts a bounded resource shared by all requests: events produced
// and not yet acknowledged (budget), or bytes of bodies being decoded
// (decodeMem). Admission never waits: a request that does not fit is
// answered 503 at once, so memory stays bounded whatever the broker or the
// clients do.
type budget struct {
	limit int64
	used  atomic.Int64
}

func (b *budget) tryAcquire(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *budget) release(n int64) { b.used.Add(-n) }

// newServer connects the producer and opens the keys file. extra kgo
// options come after the service's own, so tests can add a dialer.
func newServer(ctx context.Context, cfg Config, env platform.Env, extra ...kgo.Opt) (*server, error) {
	if err := errors.Join(cfg.Validate(), env.Topics.Check("usage")); err != nil {
		return nil, err
	}
	s := &server{
		cfg:       cfg,
		log:       env.Logger,
		dedup:     dedup.NewWindow(cfg.DedupWindow, cfg.DedupMaxIDs, nil),
		budget:    budget{limit: int64(cfg.InflightEvents)},
		decodeMem: budget{limit: cfg.DecodeMemoryBytes},
		header:    []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaUsageV1)}},
		now:       time.Now,
	}
	if traceprop.On(env.Tracing) {
		s.tracer = traceprop.Tracer(env.Tracing, "ingest")
	}
	hotCount := func(count func(*hotroute.Server) uint64) func() float64 {
		return func() float64 {
			if hot := s.hot.Load(); hot != nil {
				return float64(count(hot))
			}
			return 0
		}
	}
	s.m = newMetrics(func() float64 { return float64(s.budget.used.Load()) },
		func() float64 { return float64(s.decodeMem.used.Load()) },
		hotCount((*hotroute.Server).Served), hotCount((*hotroute.Server).HandedOff))
	if cfg.GatewayKeys.File != "" {
		f, err := apikey.Open(cfg.GatewayKeys.File, env.Logger, func(err error) {
			if err != nil {
				s.m.keyReloads.WithLabelValues("error").Inc()
			} else {
				s.m.keyReloads.WithLabelValues("ok").Inc()
			}
		})
		if err != nil {
			return nil, err
		}
		s.keys = f
	} else {
		env.Logger.Warn("ingest accepts requests without an API key (allow_anonymous); do not run this in production")
	}
	comp, _ := codec(cfg.Compression)
	opts := append([]kgo.Opt{
		kgo.DefaultProduceTopic(env.Topics.Usage),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence is on by default and needs acks=all
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchCompression(comp),
		// The budget admits at most InflightEvents records, so Produce never
		// blocks on this bound; it is the client's memory ceiling.
		kgo.MaxBufferedRecords(cfg.InflightEvents),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.WithHooks(s.m),
	}, extra...)
	cl, err := kafkaconn.NewClient(env.Kafka, opts...)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafkaconn.EnsureTopics(tctx, cl, env.Kafka, env.Topics.Usage); err != nil {
		cl.Close()
		return nil, err
	}
	s.kafka, s.quick = cl, cl
	smallComp, _ := cfg.smallRequestCodec()
	if cfg.SmallRequestMaxEvents > 0 && (cfg.SmallRequestLinger != cfg.Linger || smallComp != comp) {
		// Small requests get a producer of their own whose linger is a
		// fraction of a millisecond: a one-event request waits that long
		// for concurrent requests to join its batch, not the whole linger,
		// and up to 5 produce requests in flight let records accumulate
		// while the broker answers. The handler produces and waits; no
		// goroutine per request, as ProduceSync would need to keep
		// produce_timeout.
		quick, err := kafkaconn.NewClient(env.Kafka, append(opts, kgo.ProducerLinger(cfg.SmallRequestLinger), kgo.ProducerBatchCompression(smallComp))...)
		if err != nil {
			cl.Close()
			return nil, err
		}
		s.quick = quick
	}
	return s, nil
}

// closeProducers closes the producer clients.
func (s *server) closeProducers() {
	if s.quick != s.kafka {
		s.quick.Close()
	}
	s.kafka.Close()
}

// handler routes the events API and the service's own health endpoints.
func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/events", s.events)
	if s.usage != nil {
		mux.Handle("GET "+usageapi.Path, s.usage.Handler(s.usageTenant))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	// The events API is matched before the mux's patterns (the same
	// route): at one event per request every step of it counts.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/events" {
			s.events(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// usageTenant authenticates a usage API call by ingest key: the tenant is
// the request's ?tenant=, which the key must be allowed to report, or the
// key's only tenant when it names none.
func (s *server) usageTenant(r *http.Request) (string, int, string) {
	tenant := r.URL.Query().Get("tenant")
	if s.keys == nil {
		if tenant == "" {
			return "", http.StatusBadRequest, "Name the tenant: GET " + usageapi.Path + "?tenant=<tenant> (ingest runs without keys)."
		}
		return tenant, 0, ""
	}
	key, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		return "", http.StatusUnauthorized, "Missing API key: send Authorization: Bearer <key>."
	}
	ident := s.keys.Authenticate(key)
	if ident == nil {
		return "", http.StatusUnauthorized, "Invalid API key."
	}
	if tenant == "" {
		only, ok := ident.OnlyTenant()
		if !ok {
			return "", http.StatusBadRequest, fmt.Sprintf("Key %s may report several tenants: name one, GET %s?tenant=<tenant>.", ident.ID, usageapi.Path)
		}
		tenant = only
	}
	if !ident.Allows(tenant) {
		return "", http.StatusForbidden, fmt.Sprintf("Key %s may not read tenant %q (its tenants in services.ingest.gateway_keys.file).", ident.ID, tenant)
	}
	return tenant, 0, ""
}

// ready fails while shutting down or while the broker is unreachable, so a
// load balancer sends gateways elsewhere.
func (s *server) ready(ctx context.Context) error {
	if s.closing.Load() {
		return errors.New("shutting down")
	}
	return kafkaconn.Ready(s.kafka)(ctx)
}

// response is the JSON body of every answer to POST /v1/events.
type response struct {
	// Accepted counts events acknowledged: produced now or duplicates of
	// events produced before.
	Accepted int `json:"accepted"`
	// Duplicates counts the accepted events that were not produced again.
	Duplicates int                 `json:"duplicates"`
	Rejected   []payload.Rejection `json:"rejected"`
	// Error explains a whole-request failure (4xx without per-event
	// rejections, 5xx).
	Error string `json:"error,omitempty"`
}

func (s *server) events(w http.ResponseWriter, r *http.Request) {
	var ident *apikey.Identity
	if s.keys != nil {
		key, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			s.fail(w, http.StatusUnauthorized, "missing API key: send Authorization: Bearer <key>")
			return
		}
		if ident = s.keys.Authenticate(key); ident == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice", error="invalid_token"`)
			s.fail(w, http.StatusUnauthorized, "invalid API key")
			return
		}
	}
	if s.closing.Load() {
		s.unavailable(w, "shutting_down", "ingest is shutting down; retry against another instance")
		return
	}
	format, err := payload.FormatOf(r.Header.Get("Content-Type"))
	if err != nil {
		s.fail(w, http.StatusUnsupportedMediaType, err.Error())
		return
	}
	// What the request allocates to read and decode its body is charged
	// against decode_memory_bytes before it is allocated — the gzip
	// inflater and every array the body is read into (payload.ReadBody),
	// then the decoder's copy — and the charge is returned when the
	// request is done (this defer runs last): parallel gzip bombs get 503,
	// not the process's memory. services/ingest/README.md says what else
	// the process holds.
	var held int64
	defer func() { s.decodeMem.release(held) }()
	reserve := func(n int64) bool {
		if !s.decodeMem.tryAcquire(n) {
			return false
		}
		held += n
		return true
	}
	buf, _ := s.bodies.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	defer func() {
		// A huge body would otherwise stay pinned in the pool.
		if buf.Cap() <= 1<<20 {
			buf.Reset()
			s.bodies.Put(buf)
		}
	}()
	if err := payload.ReadBody(r.Body, r.Header.Get("Content-Encoding"), s.cfg.MaxBodyBytes, buf, reserve); err != nil {
		if errors.Is(err, payload.ErrBusy) {
			s.unavailable(w, "decode_memory", fmt.Sprintf("ingest is decoding as much as services.ingest.decode_memory_bytes = %d allows; retry later", s.cfg.DecodeMemoryBytes))
			return
		}
		s.requestError(w, err)
		return
	}
	if !reserve(int64(buf.Len())) { // the decoder's copy
		s.unavailable(w, "decode_memory", fmt.Sprintf("ingest is decoding as much as services.ingest.decode_memory_bytes = %d allows; retry later", s.cfg.DecodeMemoryBytes))
		return
	}
	batch, _ := s.batches.Get().(*payload.Batch)
	if batch == nil {
		batch = new(payload.Batch)
	}
	defer func() { batch.Reset(); s.batches.Put(batch) }()
	var allow func(string) bool
	if ident != nil {
		allow = ident.Allows
	}
	lim := payload.Limits{MaxEvents: s.cfg.MaxEventsPerRequest, MaxPast: s.cfg.MaxEventAge, MaxFuture: s.cfg.MaxEventFuture}
	if err := payload.Decode(format, buf.Bytes(), lim, s.now(), allow, batch); err != nil {
		s.requestError(w, err)
		return
	}
	s.m.batchSize.Observe(float64(batch.Total))
	s.countRejections(batch.Rejected)

	if len(batch.Events) == 0 {
		code := http.StatusBadRequest
		if allForbidden(batch.Rejected) {
			code = http.StatusForbidden
		}
		s.reply(w, code, &response{Rejected: batch.Rejected, Error: "no event was accepted; see rejected"})
		return
	}

	ctx := r.Context()
	if s.tracer != nil {
		ctx = traceprop.FromHTTP(ctx, r.Header)
	}
	res := s.produce(ctx, batch.Events)
	if s.produceFailed(w, res) {
		return
	}
	s.m.accepted.Add(float64(res.produced))
	if res.duplicates > 0 {
		s.m.duplicates.Add(float64(res.duplicates))
	}
	if len(batch.Rejected) > 0 {
		s.reply(w, http.StatusMultiStatus, &response{Accepted: len(batch.Events), Duplicates: res.duplicates, Rejected: batch.Rejected})
		return
	}
	s.replyAccepted(w, len(batch.Events), res.duplicates)
}

// produceFailed answers a request whose events the broker did not all
// acknowledge (503 with the reason) and reports whether it did.
func (s *server) produceFailed(w http.ResponseWriter, res produceResult) bool {
	switch {
	case res.budgetExhausted:
		s.unavailable(w, "budget", fmt.Sprintf("too many events are waiting for the broker (inflight_events = %d); retry later", s.cfg.InflightEvents))
		return true
	case res.timedOut:
		s.unavailable(w, "produce_timeout", fmt.Sprintf("the broker did not acknowledge the events within produce_timeout = %s; retry later, acknowledged ones will be recognised as duplicates", s.cfg.ProduceTimeout))
		return true
	case res.err != nil:
		s.unavailable(w, "produce_error", "the broker did not acknowledge every event; retry later, acknowledged ones will be recognised as duplicates")
		return true
	case res.inFlightElsewhere > 0:
		s.unavailable(w, "in_flight_duplicate", "another request is producing events with the same id; retry later")
		return true
	case res.canceled:
		// The client is most likely gone, but a proxy in between may still
		// relay the answer: it must never be an implicit 200, which a sender
		// would take for an acknowledgement of events the broker may not
		// have. Acknowledged ones are recognised as duplicates on retry.
		s.unavailable(w, "canceled", "the request was cancelled before the broker acknowledged every event; retry, acknowledged ones will be recognised as duplicates")
		return true
	}
	return false
}

// replyAccepted answers 202 with the same body reply would encode for a
// request without rejections, built without reflection: at one event per
// request the answer is a large share of the handler's work.
func (s *server) replyAccepted(w http.ResponseWriter, accepted, duplicates int) {
	s.m.accepted202.Inc()
	var a *acceptedAnswer
	if accepted < len(smallAnswers) && duplicates <= accepted {
		a = &smallAnswers[accepted][duplicates]
	} else {
		a = newAcceptedAnswer(accepted, duplicates)
	}
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = a.length
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(a.body)
}

// acceptedAnswer is the body of a 202 answer and its Content-Length.
type acceptedAnswer struct {
	body   []byte
	length []string
}

func newAcceptedAnswer(accepted, duplicates int) *acceptedAnswer {
	out := append([]byte(`{"accepted":`), strconv.Itoa(accepted)...)
	out = append(out, `,"duplicates":`...)
	out = strconv.AppendInt(out, int64(duplicates), 10)
	out = append(out, ",\"rejected\":[]}\n"...)
	return &acceptedAnswer{body: out, length: []string{strconv.Itoa(len(out))}}
}

// smallAnswers[accepted][duplicates] are the 202 answers of requests of
// up to 16 events, built once and shared (never modified): a one-event
// request's answer then costs no allocation of its own.
var smallAnswers = func() (v [17][17]acceptedAnswer) {
	for a := range v {
		for d := 0; d <= a; d++ {
			v[a][d] = *newAcceptedAnswer(a, d)
		}
	}
	return v
}()

// jsonContentType is shared by every 202 answer's header (never modified).
var jsonContentType = []string{"application/json"}

// produceResult is the outcome of producing one request's events.
type produceResult struct {
	produced, duplicates, inFlightElsewhere int
	budgetExhausted, timedOut, canceled     bool
	err                                     error
}

// tracker follows one request's records to the broker's acknowledgement.
// Marks are written as the broker answers, not by the handler: an event
// acknowledged after the handler gave up (timeout) still gets its mark, so
// the gateway's retry is recognised as a duplicate.
type tracker struct {
	s         *server
	owner     uint64
	remaining atomic.Int64
	done      chan struct{}
	mu        sync.Mutex
	err       error

	// marks are the dedup marks of the request's fresh events and recs
	// their records, in the same order; the records' values alias one
	// buffer, which lives until the broker answered.
	marks []dedup.Mark
	recs  []kgo.Record
	// A one-event request's mark, record and value live here, so that its
	// produce allocates the tracker and little else.
	oneMark [1]dedup.Mark
	oneRec  [1]kgo.Record
	oneVal  [oneValueBytes]byte

	// spans are the events' ingest spans, ended once the broker answered
	// (tracing on only).
	spans []trace.Span
}

// headers returns the headers of ev's record: the schema header and, when
// tracing is on, the context of an ingest span for ev, a child of the
// trace context ev carries (its call's, stamped by the gateway) or else of
// the request's (ctx).
func (t *tracker) headers(ctx context.Context, ev *schemas.UsageEvent) []kgo.RecordHeader {
	s := t.s
	if s.tracer == nil {
		return s.header
	}
	ctx, span := s.tracer.Start(traceprop.EventContext(ctx, ev), "ingest usage event", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String(traceprop.AttrTenant, ev.Tenant), attribute.String(traceprop.AttrEventID, ev.ID),
			attribute.Bool("sluice.estimated", ev.Estimated)))
	t.spans = append(t.spans, span)
	rec := kgo.Record{Headers: s.header}
	traceprop.Inject(ctx, &rec)
	return rec.Headers
}

// endSpans ends the events' spans with the request's outcome.
func (t *tracker) endSpans(res *produceResult) {
	for _, span := range t.spans {
		switch {
		case res.err != nil:
			span.SetStatus(codes.Error, res.err.Error())
		case res.timedOut:
			span.SetStatus(codes.Error, "produce_timeout")
		case res.canceled:
			span.SetStatus(codes.Error, "canceled")
		}
		span.End()
	}
}

// oneValueBytes holds a typical event's JSON (~400 bytes with a few
// attributes); a larger one gets a buffer of its own.
const oneValueBytes = 512

// settle records the broker's answer for the record of mark.
func (t *tracker) settle(mark dedup.Mark, err error) {
	if err == nil {
		t.s.dedup.Commit(mark, t.owner)
	} else {
		t.s.dedup.Abort(mark, t.owner)
		t.s.m.produceErrors.Inc()
		t.mu.Lock()
		if t.err == nil {
			t.err = err
		}
		t.mu.Unlock()
	}
	t.s.budget.release(1)
	if t.remaining.Add(-1) == 0 {
		close(t.done)
	}
}

// settleOne is the promise of a one-record request.
func (t *tracker) settleOne(_ *kgo.Record, err error) { t.settle(t.marks[0], err) }

func (t *tracker) promise(mark dedup.Mark) func(*kgo.Record, error) {
	return func(_ *kgo.Record, err error) { t.settle(mark, err) }
}

// waitTimers holds stopped timers for produce's wait: a timer and its
// channel per request were two of every one-event request's ~20
// allocations.
var waitTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// produce claims each event's id, produces the new ones and waits for the
// broker's acknowledgement of every one of them, up to ProduceTimeout.
func (s *server) produce(ctx context.Context, events []schemas.UsageEvent) produceResult {
	var res produceResult
	t := &tracker{s: s, owner: s.owners.Add(1)}
	var fresh []*schemas.UsageEvent
	if len(events) == 1 {
		t.marks = t.oneMark[:0]
	} else {
		t.marks = make([]dedup.Mark, 0, len(events))
		fresh = make([]*schemas.UsageEvent, 0, len(events))
	}
	for i := range events {
		ev := &events[i]
		state, mark := s.dedup.Begin(dedup.Key{Tenant: ev.Tenant, ID: ev.ID, Estimated: ev.Estimated}, t.owner)
		switch state {
		case dedup.Claimed:
			t.marks = append(t.marks, mark)
			if fresh != nil {
				fresh = append(fresh, ev)
			}
		case dedup.Acknowledged, dedup.SameOwner:
			res.duplicates++
		case dedup.InFlight:
			res.inFlightElsewhere++
		}
	}
	if res.duplicates > 0 {
		s.m.dedupHits.Add(float64(res.duplicates))
	}
	n := len(t.marks)
	if n == 0 {
		return res
	}
	if !s.budget.tryAcquire(int64(n)) {
		for _, k := range t.marks {
			s.dedup.Abort(k, t.owner)
		}
		res.budgetExhausted = true
		return res
	}
	res.produced = n
	t.done = make(chan struct{})
	t.remaining.Store(int64(n))
	if fresh == nil {
		ev := &events[0]
		// The value, then the key, in the tracker's own buffer.
		buf := eventjson.AppendUsageEventJSON(t.oneVal[:0], ev)
		end := len(buf)
		buf = append(buf, ev.Tenant...)
		t.oneRec[0] = kgo.Record{Key: buf[end:], Value: buf[:end:end], Headers: t.headers(ctx, ev)}
		t.recs = t.oneRec[:]
	} else {
		// One buffer and one record slice per request.
		var size int
		for _, ev := range fresh {
			size += 256 + len(ev.Attributes)*64
		}
		buf := make([]byte, 0, size)
		ends := make([]int, n)
		for j, ev := range fresh {
			buf = eventjson.AppendUsageEventJSON(buf, ev)
			ends[j] = len(buf)
		}
		t.recs = make([]kgo.Record, n)
		prev := 0
		for j, ev := range fresh {
			t.recs[j] = kgo.Record{Key: []byte(ev.Tenant), Value: buf[prev:ends[j]:ends[j]], Headers: t.headers(ctx, ev)}
			prev = ends[j]
		}
	}
	start := time.Now()
	// Requests of at most small_request_max_events go to the producer with
	// the short linger (see newServer); larger ones fill batches by
	// themselves, and while they linger concurrent ones join the same
	// produce request (on a busy 2-core machine 1,000-event requests lost
	// throughput when every request drained at once: bench/README.md).
	cl := s.kafka
	if n <= s.cfg.SmallRequestMaxEvents {
		cl = s.quick
	}
	// context.Background: kgo cancels a whole partition's buffered records
	// by the first record's context, so a per-request context would let
	// one impatient request fail its neighbours' events. The wait below
	// enforces the request's deadline instead.
	if n == 1 {
		cl.Produce(context.Background(), &t.recs[0], t.settleOne)
	} else {
		for j := range t.recs {
			cl.Produce(context.Background(), &t.recs[j], t.promise(t.marks[j]))
		}
	}
	timer := waitTimers.Get().(*time.Timer)
	timer.Reset(s.cfg.ProduceTimeout)
	defer func() {
		timer.Stop() // since Go 1.23 no stale expiry is received after Stop
		waitTimers.Put(timer)
	}()
	select {
	case <-t.done:
		s.m.produceLatency.Observe(time.Since(start).Seconds())
		t.mu.Lock()
		res.err = t.err
		t.mu.Unlock()
	case <-timer.C:
		res.timedOut = true
	case <-ctx.Done():
		res.canceled = true
	}
	if t.spans != nil {
		t.endSpans(&res)
	}
	return res
}

func (s *server) countRejections(rs []payload.Rejection) {
	if len(rs) == 0 {
		return
	}
	s.m.events.WithLabelValues("rejected").Add(float64(len(rs)))
	for _, r := range rs {
		reason := "invalid"
		switch {
		case r.Forbidden:
			reason = "tenant_forbidden"
		case len(r.Errors) == 1 && r.Errors[0].Reason == payload.ProblemsNotListed:
			// Its problems were not kept (the answer's cap): counted as invalid.
		case len(r.Errors) == 1 && r.Errors[0].Field == "":
			reason = "malformed"
		case len(r.Errors) == 1 && r.Errors[0].Field == "time" && strings.Contains(r.Errors[0].Reason, "max_event_"):
			reason = "time_window"
		}
		s.m.rejected.WithLabelValues(reason).Inc()
	}
}

func allForbidden(rs []payload.Rejection) bool {
	for _, r := range rs {
		if !r.Forbidden {
			return false
		}
	}
	return len(rs) > 0
}

// requestError maps a whole-request failure to its status code.
func (s *server) requestError(w http.ResponseWriter, err error) {
	var (
		le *payload.LimitError
		se *payload.SyntaxError
		ue *payload.UnsupportedError
	)
	switch {
	case errors.As(err, &le):
		s.fail(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.As(err, &se):
		s.fail(w, http.StatusBadRequest, err.Error())
	case errors.As(err, &ue):
		s.fail(w, http.StatusUnsupportedMediaType, err.Error())
	default:
		// Reading the body failed: the client went away or sent garbage
		// framing at the HTTP level.
		s.fail(w, http.StatusBadRequest, "reading the request body failed: "+err.Error())
	}
}

func (s *server) unavailable(w http.ResponseWriter, cause, msg string) {
	s.m.unavailable.WithLabelValues(cause).Inc()
	w.Header().Set("Retry-After", strconv.Itoa(int(s.cfg.RetryAfter/time.Second)))
	s.fail(w, http.StatusServiceUnavailable, msg)
}

func (s *server) fail(w http.ResponseWriter, code int, msg string) {
	s.reply(w, code, &response{Rejected: []payload.Rejection{}, Error: msg})
}

func (s *server) reply(w http.ResponseWriter, code int, body *response) {
	if body.Rejected == nil {
		body.Rejected = []payload.Rejection{}
	}
	s.m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

func bearer(h string) (string, bool) {
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}
