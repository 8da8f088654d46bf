package middleware

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// TestGuardBeforeTheUpstream: a gateway built on the SDK gets the
// upstream Guard from the middleware. The handler's 500s are the
// upstream's failures: after two in a row the Guard's breaker opens, and
// the next request is refused before the handler runs — 503 with
// Retry-After and code breaker_open, one refusal event naming the reason
// and the request's class — while the calls that ran were settled and
// released their slots.
func TestGuardBeforeTheUpstream(t *testing.T) {
	g, err := upstream.New("llm", upstream.Limit(concurrency.Fixed(2)), upstream.BreakerOptions(upstream.ConsecutiveFailures(2)))
	if err != nil {
		t.Fatal(err)
	}
	s, calls := &emittertest.Recorder{}, 0
	h := metered(t, fixed{}, newEstimator(t), s, func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusInternalServerError)
	}, WithGuard(func(r *http.Request, tenant, model string) (*upstream.Guard, upstream.Request, bool) {
		return g, upstream.Request{Priority: schemas.PriorityHigh}, model == "gpt-4o-mini"
	}))
	for i := range 2 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, chatRequest(context.Background(), "acme"))
		if rec.Code != http.StatusInternalServerError {
			t.Fatalf("call %d: %d", i, rec.Code)
		}
	}
	if st := g.Stats(); st.InFlight != 0 || st.Breaker.State != upstream.Open {
		t.Fatalf("after two failed calls: %d in flight, breaker %s; want 0 and open", st.InFlight, st.Breaker.State)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, chatRequest(context.Background(), "acme"))
	var body ratelimit.Body
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" ||
		json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Code != "breaker_open" || calls != 2 {
		t.Fatalf("with the breaker open: %d %s %v, handler ran %d times", rec.Code, rec.Body, rec.Header(), calls)
	}
	var refusals []schemas.UsageEvent
	for _, ev := range s.Events() {
		if ev.Outcome == schemas.OutcomeRejected {
			refusals = append(refusals, ev)
		}
	}
	if len(refusals) != 1 || refusals[0].Attributes["refused_by"] != "upstream" || refusals[0].Attributes["reason"] != "breaker_open" ||
		refusals[0].Priority != schemas.PriorityHigh || refusals[0].Status != http.StatusServiceUnavailable || refusals[0].Validate() != nil {
		t.Errorf("refusal events: %+v", refusals)
	}
}

// TestGuardTakesTheIdentitysPriority: a GuardFunc that names no class
// leaves the request the class its Identity gives, here high: the Guard
// queues it as high and its refusal event says so; a header that names
// no class counts as none: the Guard judges it normal, as its refusal
// event says, and the event stays valid.
func TestGuardTakesTheIdentitysPriority(t *testing.T) {
	g, err := upstream.New("llm", upstream.Limit(concurrency.Fixed(1)), upstream.BreakerOptions(upstream.ConsecutiveFailures(1)))
	if err != nil {
		t.Fatal(err)
	}
	s := &emittertest.Recorder{}
	h := New(fixed{}, callerIdentity, WithClock(func() time.Time { return now }), WithEmitter(s, "gw-1"), WithEstimates(newEstimator(t)),
		WithGuard(func(r *http.Request, tenant, model string) (*upstream.Guard, upstream.Request, bool) {
			return g, upstream.Request{}, true
		}))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, callerRequest("alice", schemas.PriorityHigh, chatBody)) // fails: the breaker opens
	if st := g.Stats(); rec.Code != http.StatusBadGateway || st.Queue.Admitted[schemas.PriorityHigh.Index()] != 1 {
		t.Fatalf("first call: %d, admitted per class %v; want 502 and one high", rec.Code, st.Queue.Admitted)
	}
	for _, prio := range []schemas.Priority{schemas.PriorityHigh, "bogus"} {
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, callerRequest("alice", prio, chatBody))
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("priority %q with the breaker open: %d", prio, rec.Code)
		}
	}
	evs := s.Events()
	want := []schemas.Priority{schemas.PriorityHigh, schemas.PriorityNormal}
	for i, ev := range evs[len(evs)-2:] {
		if ev.Outcome != schemas.OutcomeRejected || ev.Priority != want[i] || ev.User != "alice" || ev.Validate() != nil {
			t.Errorf("refusal event %d: %+v (%v), want priority %q and user alice", i, ev, ev.Validate(), want[i])
		}
	}
}
