package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// proxy runs after the flag check and the estimate: admission, the
// upstream call with failover, the relay, and the usage report the
// middleware settles with when proxy returns.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	c := callFrom(r.Context())
	mc := middleware.CallFrom(r.Context()) // never nil on the API paths
	est, estOK := mc.Estimate()
	status := 0
	if s.admit != nil {
		adm := s.admit.Admit(r.Context(), frontend.AdmitRequest{Tenant: c.caller.Tenant, Model: c.req.Model, User: c.user,
			APIKeyID: c.caller.KeyID, Endpoint: c.endpoint, Priority: c.priority, EstimatePrompt: est.Prompt,
			EstimateCompletion: est.Completion, Estimated: estOK, EventID: c.eventID})
		for _, l := range adm.Limits {
			ratelimit.SetHeaders(w.Header(), l)
		}
		if f := adm.Refused; f != nil {
			mc.SetOutcome(schemas.OutcomeRejected)
			mc.SetAttribute("refused_by", "admission")
			c.outcome, c.source = "rejected", "none"
			st := f.Status
			if st < 400 || st > 599 {
				st = http.StatusTooManyRequests
			}
			ratelimit.WriteError(w, st, f.Error, f.RetryAfter)
			return
		}
		if adm.Settle != nil {
			defer func() { adm.Settle(c.settlement(status, est)) }()
		}
	}
	models, settleSoft := s.modelsFor(r.Context(), c, est, estOK)
	if settleSoft != nil {
		defer func() { settleSoft(c.settlement(status, est)) }()
	}

	strip := c.req.Stream && !c.req.IncludeUsage && (c.ep == estimate.ChatCompletions || c.ep == estimate.Completions)
	suffix := strings.TrimPrefix(r.URL.Path, "/v1")

	var (
		resp    *http.Response
		done    func()
		lastErr error
		up      *provider
		permit  upstream.Permit
		refused *priority.Decision // the last guard refusal
	)
	served := c.req.Model
models:
	for mi, model := range models {
		ups := c.ups
		if mi > 0 {
			if ups, _ = s.routes.lookup(model); ups == nil {
				continue
			}
		}
		body := c.body
		if model != c.req.Model {
			body = withModel(body, c.req, model)
		}
		if strip {
			// The client did not ask for the usage chunk; the gateway needs it
			// and removes it from what the client receives.
			rq, _ := scanRequest(body)
			body = withIncludeUsage(body, rq)
		}
		cands := order(ups, s.cfg.MaxAttempts, s.now())
		fallback := false // every refusal of this model lets a cheaper one serve
		for i, u := range cands {
			var p upstream.Permit
			if g := s.guards.Of(u.cfg.Name); g != nil {
				gp, d := g.Acquire(r.Context(), upstream.Request{Tenant: c.caller.Tenant, Priority: c.priority, Deadline: c.deadline, Tokens: est.Prompt + est.Completion})
				if !d.Admitted() {
					refused, fallback = &d, d.Reason == priority.BreakerOpen || d.Reason == priority.Degraded
					s.m.guardRefusals.WithLabelValues(u.cfg.Name, d.Reason.String()).Inc()
					if d.Reason == priority.Canceled {
						break models
					}
					if !fallback {
						break models // saturated: a cheaper model is no answer to a full queue
					}
					continue // another upstream of the model may take it
				}
				p = gp
			}
			c.attempts++
			c.upstream, up, served = u.cfg.Name, u, model
			var err error
			resp, done, err = s.attempt(r.Context(), u, suffix, body, c.requestID, r.Header)
			last := i == len(cands)-1
			if err != nil {
				p.Settle(0) // no answer: no tokens spent
				p.Release(outcomeOf(0, err, r.Context().Err() != nil))
				lastErr = err
				u.failed(s.now())
				if r.Context().Err() != nil {
					break models // the client went away: nothing to fail over for
				}
				if !last {
					s.m.failovers.WithLabelValues(u.cfg.Name).Inc()
				}
				continue
			}
			if retryable(resp.StatusCode) {
				u.failed(s.now())
				if !last {
					p.Settle(0)
					p.Release(concurrency.Failure)
					s.m.failovers.WithLabelValues(u.cfg.Name).Inc()
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
					resp.Body.Close()
					done()
					resp = nil
					continue
				}
			} else {
				u.succeeded()
			}
			permit = p
			break models
		}
		if !fallback {
			break
		}
	}
	mc.SetProvider(c.upstream)
	if c.attempts > 1 {
		mc.SetAttribute("attempts", strconv.Itoa(c.attempts))
	}
	if served != c.req.Model {
		mc.SetServedModel(served)
		s.m.fallbacks.WithLabelValues(c.route, served).Inc()
	}
	if c.attempts > 0 {
		w.Header().Set(HeaderServedModel, served)
	}
	if resp == nil && c.attempts == 0 && refused != nil {
		// Every upstream that could serve it refused on the request path.
		c.source = "none"
		mc.SetOutcome(schemas.OutcomeRejected)
		mc.SetAttribute("refused_by", refused.Reason.String())
		c.outcome, status = "rejected", refused.Status()
		if refused.Reason == priority.Canceled {
			c.outcome = "cancelled"
			return
		}
		priority.WriteRefusal(w, *refused)
		return
	}
	if resp == nil {
		c.source = "none"
		switch {
		case r.Context().Err() != nil:
			c.outcome = "cancelled"
		case isTimeout(lastErr):
			c.outcome, status = "timeout", http.StatusGatewayTimeout
			mc.SetOutcome(schemas.OutcomeTimeout)
			writeError(w, status, "timeout", "upstream_timeout", fmt.Sprintf("The model provider (%s) did not answer in time.", c.upstream))
		default:
			c.outcome, status = "upstream_error", http.StatusBadGateway
			writeError(w, status, "api_error", "upstream_unavailable", fmt.Sprintf("The model provider (%s) could not be reached.", c.upstream))
		}
		return
	}
	defer func() {
		// The call is over once its answer is relayed: a token share counts
		// what it used instead of its estimate, its slot goes to the next
		// request, its outcome to the limit and the breaker.
		u := c.settlement(status, est).Usage
		permit.Settle(u.PromptTokens + u.CompletionTokens)
		permit.Release(outcomeOf(status, outcomeErr(c.outcome), c.outcome == "cancelled"))
	}()
	defer done()
	defer resp.Body.Close()

	if id := resp.Header.Get(headerRequestID); id != "" && len(id) <= schemas.MaxAttributeValueLen && validID(id) {
		c.upstreamID = id
		mc.SetAttribute("upstream_request_id", id)
	}
	h := w.Header()
	for _, k := range []string{"Content-Type", "Cache-Control", "Openai-Processing-Ms", "Openai-Version", "Retry-After"} {
		if v := resp.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	status = resp.StatusCode
	w.WriteHeader(status)
	if status/100 != 2 {
		// The provider refused or failed: relayed as it is, settled at
		// zero tokens (nothing billed), outcome error from 500 on.
		c.source = "none"
		if status >= 500 {
			c.outcome = "upstream_error"
		} else {
			c.outcome = "upstream_" + strconv.Itoa(status)
		}
		_, _ = io.Copy(w, io.LimitReader(resp.Body, s.cfg.MaxResponseBytes))
		return
	}
	fam := estimate.FamilyOf(served)
	var prompt int64
	if estOK {
		prompt = est.PromptTokens // counted, without the estimate's margin
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "text/event-stream" {
		s.relayStream(w, r, resp, up, c, mc, strip, fam, prompt)
		return
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes+1))
	if int64(len(data)) > s.cfg.MaxResponseBytes {
		// Too long to search for usage: relayed, settled at the estimate.
		c.source = "estimate"
		if _, err := w.Write(data); err == nil {
			_, _ = io.Copy(w, resp.Body)
		}
		return
	}
	if _, werr := w.Write(data); werr != nil && r.Context().Err() != nil {
		mc.SetAttribute("cancelled", "client")
		c.outcome = "cancelled"
	}
	if err != nil && s.hardStop.Err() != nil {
		// Cut by the end of the shutdown drain: settled at the estimate,
		// not as the provider's failure.
		mc.SetAttribute("cancelled", "shutdown")
		c.outcome, c.source = "cancelled", "estimate"
		return
	}
	if err != nil {
		// The answer broke off: no usage to read, and the provider's
		// bill for it unknown; settled as a failed call.
		c.outcome, c.source = "upstream_error", "none"
		mc.SetOutcome(schemas.OutcomeError)
		if isTimeout(err) {
			c.outcome = "timeout"
			mc.SetOutcome(schemas.OutcomeTimeout)
		}
		return
	}
	var d doc
	if json.Unmarshal(data, &d) != nil {
		c.source = "estimate" // a 2xx that is not JSON: settled at the estimate
		return
	}
	if u := d.reported(); u != nil {
		c.usage, c.source = u.usage(), "reported"
	} else {
		c.usage, c.source = middleware.Usage{PromptTokens: prompt, CompletionTokens: d.count(fam), Counted: true}, "counted"
	}
	mc.Report(c.usage)
}

// settlement is what an admitted call used, for an Admitter's Settle:
// status is the one answered.
func (c *call) settlement(status int, est estimate.Estimate) frontend.Settlement {
	set := frontend.Settlement{Status: status, Outcome: schemas.OutcomeOK}
	switch {
	case c.outcome == "timeout":
		set.Outcome = schemas.OutcomeTimeout
	case status >= 500 || c.outcome == "upstream_error":
		set.Outcome = schemas.OutcomeError
	case c.outcome == "cancelled":
		set.Outcome = ""
	}
	if c.source == "reported" || c.source == "counted" {
		set.Usage = c.usage
	} else if c.source == "estimate" {
		set.Usage = middleware.Usage{PromptTokens: est.Prompt, CompletionTokens: est.Completion}
	}
	return set
}

// modelsFor lists the models that may serve c, in order: the one asked
// for, then the cheaper fallbacks the policy names for it that the key
// may use. A tenant past a soft quota skips the model asked for when it
// has a fallback: a period quota or budget through the enforcer's soft
// flag (flags.StateSoft, read from the Checker's memory), a
// tokens_per_minute or requests_per_minute quota through the soft
// Admitter, when there is one. settle, when not nil, must be called
// with the call's settlement.
func (s *Server) modelsFor(ctx context.Context, c *call, est estimate.Estimate, estOK bool) (models []string, settle func(frontend.Settlement)) {
	models = []string{c.req.Model}
	if s.policy == nil {
		return models, nil
	}
	for _, m := range s.policy().Fallbacks(c.req.Model) {
		if c.caller.MayUse(m) {
			models = append(models, m)
		}
	}
	if len(models) == 1 {
		return models, nil
	}
	if s.over != nil && s.over(c.caller.Tenant, c.req.Model, c.caller.KeyID) != nil {
		// Past a soft hourly, daily, monthly or budget quota (the
		// enforcer's soft flag): the cheaper model serves it.
		s.m.softOver.Inc()
		return models[1:], nil
	}
	if s.soft == nil {
		return models, nil
	}
	adm := s.soft.Admit(ctx, frontend.AdmitRequest{Tenant: c.caller.Tenant, Model: c.req.Model, User: c.user,
		APIKeyID: c.caller.KeyID, Endpoint: c.endpoint, Priority: c.priority, EstimatePrompt: est.Prompt,
		EstimateCompletion: est.Completion, Estimated: estOK, EventID: c.eventID})
	if adm.Refused != nil {
		s.m.softOver.Inc()
		return models[1:], nil
	}
	return models, adm.Settle
}

// softFlags is the part of the Checker (checker.Checker.Over) that finds
// a tenant's soft-quota flag.
type softFlags interface {
	Over(tenant, model, apiKeyID string) *flags.Flag
}

// HeaderServedModel names, on every answer an upstream gave, the model
// that served it: the one asked for, or a cheaper fallback the policy
// names when the asked model's upstream is broken or degraded or the
// tenant is past a soft limit.
const HeaderServedModel = "X-Sluice-Served-Model"

// outcomeErr turns the call's outcome into the error outcomeOf reads: a
// relay that broke off or timed out failed on the provider's side.
func outcomeErr(outcome string) error {
	if outcome == "timeout" || outcome == "upstream_error" {
		return errUpstreamBroke
	}
	return nil
}

var errUpstreamBroke = errors.New("the upstream's answer broke off")

// attempt sends one request to u. done releases the attempt's context
// once its answer has been relayed.
func (s *Server) attempt(ctx context.Context, u *provider, suffix string, body []byte, requestID string, in http.Header) (*http.Response, func(), error) {
	actx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
	stop := context.AfterFunc(s.hardStop, cancel) // shutdown's end cuts every call
	done := func() { stop(); cancel() }
	req, err := http.NewRequestWithContext(actx, http.MethodPost, u.base+suffix, bytes.NewReader(body))
	if err != nil {
		done()
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sluice-gateway")
	req.Header.Set(headerRequestID, requestID)
	if u.key != "" {
		req.Header.Set("Authorization", "Bearer "+u.key)
	}
	for _, k := range []string{"Accept", "Openai-Beta"} {
		if v := in.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
	start := time.Now()
	resp, err := u.client.Do(req)
	elapsed := time.Since(start).Seconds()
	if err != nil {
		result := "error"
		if isTimeout(err) {
			result = "timeout"
		}
		if ctx.Err() == nil {
			s.m.upstream.WithLabelValues(u.cfg.Name, result).Observe(elapsed)
		}
		done()
		return nil, nil, err
	}
	result := "ok"
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		result = "status_429"
	case resp.StatusCode >= 500:
		result = "status_5xx"
	case resp.StatusCode >= 400:
		result = "status_4xx"
	}
	s.m.upstream.WithLabelValues(u.cfg.Name, result).Observe(elapsed)
	return resp, done, nil
}

// retryable says whether another upstream may do better than this answer:
// the provider's rate limit or a failure on its side.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout, 529:
		return true
	}
	return false
}

func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// listModels answers GET /v1/models with the models this key may use:
// every model an upstream names exactly, and every exact name in the
// key's list that some upstream's pattern serves. Models reachable only
// through patterns on both sides cannot be listed.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	caller := s.authenticate(w, r)
	if caller == nil {
		return
	}
	names := s.routes.exactModels()
	keyModels, _ := caller.Models()
	names = append(names, keyModels...)
	slices.Sort(names)
	names = slices.Compact(names)
	data := make([]modelObject, 0, len(names))
	for _, m := range names {
		if ups, _ := s.routes.lookup(m); ups != nil && caller.MayUse(m) && !strings.ContainsAny(m, `*?[\`) {
			data = append(data, modelObject{ID: m, Object: "model", OwnedBy: "sluice"})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// getModel answers GET /v1/models/{model}.
func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	caller := s.authenticate(w, r)
	if caller == nil {
		return
	}
	m := r.PathValue("model")
	if ups, _ := s.routes.lookup(m); ups == nil || !caller.MayUse(m) {
		writeParamError(w, http.StatusNotFound, "model", "model_not_found",
			fmt.Sprintf("The model `%s` does not exist or this API key may not use it.", m))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(modelObject{ID: m, Object: "model", OwnedBy: "sluice"})
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) *frontend.Caller {
	if c := deferredCaller(r.Context()); c != nil {
		return c // a deferred task's run (deferred.go)
	}
	c := s.callerOf(r)
	if c == nil {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", badKeyMessage)
	}
	return c
}

// badKeyMessage answers a request without a known tenant key.
const badKeyMessage = "Incorrect API key provided. Send a Sluice gateway key as Authorization: Bearer <key>."

// callerOf returns the tenant key r authenticates with, nil for none.
func (s *Server) callerOf(r *http.Request) *frontend.Caller {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return s.keys.Authenticate(strings.TrimSpace(key))
}
