package gateway

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// relay is the proxy's third stage: it passes the upstream's answer to the
// client — the headers a client of the provider reads, the status, the
// body (streams event by event, relayStream) — and reads what the call
// used: the provider's usage, or the text it generated, counted, when it
// reports none. What it read goes to the middleware (Report) for the
// settlement.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, c *call, st *settlement, ex exchange, est estimate.Estimate, estOK bool) {
	resp := ex.resp
	if id := resp.Header.Get(headerRequestID); id != "" && len(id) <= schemas.MaxAttributeValueLen && validID(id) {
		c.upstreamID = id
		c.mc.SetAttribute("upstream_request_id", id)
	}
	h := w.Header()
	for _, k := range []string{"Content-Type", "Cache-Control", "Openai-Processing-Ms", "Openai-Version", "Retry-After", "Request-Id"} {
		if v := resp.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	st.status = resp.StatusCode
	c.relaying = true
	w.WriteHeader(st.status)
	if st.status/100 != 2 {
		// The provider refused or failed: relayed as it is, settled at
		// zero tokens (nothing billed), outcome error from 500 on.
		c.source = usageNone
		_, _ = io.Copy(w, io.LimitReader(resp.Body, s.cfg.MaxResponseBytes))
		if st.status >= 500 {
			c.end(schemas.OutcomeError, "upstream_"+strconv.Itoa(st.status))
		} else {
			c.end(schemas.OutcomeOK, "upstream_"+strconv.Itoa(st.status))
		}
		return
	}
	fam := estimate.FamilyOf(ex.model)
	var prompt int64
	if estOK {
		prompt = est.PromptTokens // counted, without the estimate's margin
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "text/event-stream" {
		s.relayStream(w, r, resp, c, fam, prompt)
		return
	}
	if c.dialect == policy.DialectGemini && c.req.Stream {
		s.relayGeminiArray(w, r, resp, c, fam, prompt)
		return
	}
	s.relayWhole(w, r, c, resp, fam, prompt)
}

// relayWhole relays a non-streamed answer and reads its usage.
func (s *Server) relayWhole(w http.ResponseWriter, r *http.Request, c *call, resp *http.Response, fam estimate.Family, prompt int64) {
	data, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes+1))
	if int64(len(data)) > s.cfg.MaxResponseBytes {
		// Too long to search for usage: relayed, settled at the estimate.
		c.source = usageEstimate
		if _, err := w.Write(data); err == nil {
			_, _ = io.Copy(w, resp.Body)
		}
		c.end(schemas.OutcomeOK, "")
		return
	}
	if r.Context().Err() != nil {
		// The client left: its answer is read all the same (callContext)
		// and metered with the provider's usage, and the call ends as
		// cut by its client, which no breaker counts against the provider.
		c.mc.SetAttribute("cancelled", "client")
		c.end("", codeClientClosed)
	}
	_, _ = w.Write(data)
	if err != nil && s.hardStop.Err() != nil {
		// Cut by the end of the shutdown drain: settled at the estimate,
		// not as the provider's failure.
		c.mc.SetAttribute("cancelled", codeShutdown)
		c.source = usageEstimate
		c.end("", codeShutdown)
		return
	}
	if err != nil {
		// The answer broke off: no usage to read, and the provider's
		// bill for it unknown; settled as a failed call.
		c.source = usageNone
		if isTimeout(err) {
			c.end(schemas.OutcomeTimeout, "upstream_timeout")
		} else {
			c.end(schemas.OutcomeError, codeStreamCut)
		}
		return
	}
	u, src, ok := usageOfWhole(c.dialect, data, fam, prompt)
	if !ok {
		c.source = usageEstimate // a 2xx that is not JSON: settled at the estimate
		c.end(schemas.OutcomeOK, "")
		return
	}
	c.usage, c.source = u, src
	c.mc.Report(c.usage)
	c.end(schemas.OutcomeOK, "")
}

// usageOfWhole reads the usage of a whole answer in dialect: the
// provider's, or prompt and the generated text counted when it reports
// none. ok is false for an answer that is not JSON.
func usageOfWhole(dialect string, data []byte, fam estimate.Family, prompt int64) (middleware.Usage, usageSource, bool) {
	switch dialect {
	case policy.DialectAnthropic:
		return anthropicWhole(data, fam, prompt)
	case policy.DialectGemini:
		return geminiWhole(data, fam, prompt)
	}
	var d doc
	if json.Unmarshal(data, &d) != nil {
		return middleware.Usage{}, usageEstimate, false
	}
	if u := d.reported(); u != nil {
		return u.Usage(), usageReported, true
	}
	return middleware.Usage{PromptTokens: prompt, CompletionTokens: d.count(fam), Counted: true}, usageCounted, true
}
