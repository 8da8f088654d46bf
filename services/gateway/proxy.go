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

	"github.com/sluicehq/sluice/gateway/estimate"
	"github.com/sluicehq/sluice/gateway/middleware"
	"github.com/sluicehq/sluice/gateway/ratelimit"
	"github.com/sluicehq/sluice/schemas"
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
		adm := s.admit.Admit(r.Context(), AdmitRequest{Tenant: c.caller.Tenant, Model: c.req.Model, User: c.user,
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
			defer func() {
				set := Settlement{Status: status, Outcome: schemas.OutcomeOK}
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
				adm.Settle(set)
			}()
		}
	}

	body := c.body
	strip := false
	if c.req.Stream && !c.req.IncludeUsage && (c.ep == estimate.ChatCompletions || c.ep == estimate.Completions) {
		// The client did not ask for the usage chunk; the gateway needs it
		// and removes it from what the client receives.
		body, strip = withIncludeUsage(c.body, c.req), true
	}
	suffix := strings.TrimPrefix(r.URL.Path, "/v1")

	var (
		resp    *http.Response
		done    func()
		lastErr error
		up      *upstream
	)
	cands := order(c.ups, s.cfg.MaxAttempts, s.now())
	for i, u := range cands {
		c.attempts, c.upstream, up = i+1, u.cfg.Name, u
		var err error
		resp, done, err = s.attempt(r.Context(), u, suffix, body, c.requestID, r.Header)
		last := i == len(cands)-1
		if err != nil {
			lastErr = err
			u.failed(s.now())
			if r.Context().Err() != nil {
				break // the client went away: nothing to fail over for
			}
			if !last {
				s.m.failovers.WithLabelValues(u.cfg.Name).Inc()
			}
			continue
		}
		if retryable(resp.StatusCode) {
			u.failed(s.now())
			if !last {
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
		break
	}
	mc.SetProvider(c.upstream)
	if c.attempts > 1 {
		mc.SetAttribute("attempts", strconv.Itoa(c.attempts))
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
	fam := estimate.FamilyOf(c.req.Model)
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

// attempt sends one request to u. done releases the attempt's context
// once its answer has been relayed.
func (s *Server) attempt(ctx context.Context, u *upstream, suffix string, body []byte, requestID string, in http.Header) (*http.Response, func(), error) {
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
	names = append(names, caller.models...)
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

func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) *Caller {
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
func (s *Server) callerOf(r *http.Request) *Caller {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return s.keys.Authenticate(strings.TrimSpace(key))
}
