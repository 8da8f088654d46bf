package middleware

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

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
