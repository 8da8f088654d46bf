package upstream_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// A gateway handler in front of one upstream: the request's class from
// the tenant's policy and the priority header, one Acquire, a refusal
// written as OpenAI would, and the Permit released with the upstream's
// outcome.
func ExampleGuard() {
	llm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer llm.Close()

	alg, err := concurrency.NewGradient(concurrency.InitialLimit(50), concurrency.MaxLimit(200))
	if err != nil {
		panic(err)
	}
	guard, err := upstream.New("openai-main", upstream.Limit(alg), upstream.TenantShare(0.5))
	if err != nil {
		panic(err)
	}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenantClass := schemas.PriorityHigh                // from the tenant's policy
		grant := priority.Grant{Max: schemas.PriorityHigh} // from the caller's API key
		class, err := priority.Effective(tenantClass, r.Header.Get(priority.Header), grant)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		permit, d := guard.Acquire(r.Context(), upstream.Request{
			Tenant: "acme", Priority: class, Deadline: time.Now().Add(2 * time.Second),
		})
		if !d.Admitted() {
			priority.WriteRefusal(w, d)
			return
		}
		up, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, llm.URL, r.Body)
		resp, err := http.DefaultClient.Do(up)
		outcome := concurrency.Success
		switch {
		case r.Context().Err() != nil:
			outcome = concurrency.Ignored // the caller went away: says nothing of the upstream
		case err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
			outcome = concurrency.Failure
		}
		if err == nil {
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
			resp.Body.Close()
		}
		permit.Release(outcome)
	})

	for _, asked := range []string{"", "low", "critical"} {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Header.Set(priority.Header, asked)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Printf("%q: %d %s\n", asked, rec.Code, rec.Body.String())
	}
	// Output:
	// "": 200 {"choices":[]}
	// "low": 200 {"choices":[]}
	// "critical": 400 X-Sluice-Priority: "critical" is above "high": this API key may not raise its priority that far
}
