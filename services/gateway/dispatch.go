package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// exchange is what dispatch got for a call: an upstream's answer, or why
// there is none.
type exchange struct {
	// resp is the answer of provider, for model; done releases the
	// attempt's context once the answer is relayed; permit is the
	// upstream guard's admission of the call.
	resp     *http.Response
	done     func()
	provider *provider
	model    string
	permit   upstream.Permit
	// shortenedTo is the output cap a degradation level served the call
	// with (action shorten), 0 when it went as asked.
	shortenedTo int64

	// Without an answer: refused is the last guard refusal (when every
	// upstream that could serve the call refused it before a call),
	// admission the last refusal of the rules scoped by model or upstream,
	// err the last attempt's error.
	refused   *priority.Decision
	admission *frontend.Refusal
	err       error
}

// dispatch is the proxy's second stage: it tries models in order (the one
// asked for, then its fallbacks) and, for each, up to max_attempts of its
// upstreams, each through the upstream's guard (queue, concurrency limit,
// degradation, breaker, reserved shares). A connection failure, a timeout
// before the answer, 429 or 5xx moves on to the next upstream; a guard
// refusal that a cheaper model can answer (a broken or degraded upstream)
// moves on to the next model. It returns the first answer worth relaying.
func (s *Server) dispatch(ctx context.Context, w http.ResponseWriter, in http.Header, c *call, models []string, st *settlement) exchange {
	ex := exchange{model: c.req.Model}
	for mi, model := range models {
		ups := c.ups
		if mi > 0 {
			if ups, _ = s.routes.Load().lookup(c.dialect, model); ups == nil {
				continue
			}
		}
		fallback, stop := s.tryModel(ctx, w, in, c, model, ups, st, &ex)
		if stop || !fallback {
			break
		}
	}
	return ex
}

// tryModel tries model on its upstreams ups. It fills ex with an answer,
// or with the last refusal or error; fallback says every refusal was one a
// cheaper model may answer, stop that the call must end here (an answer,
// or a client gone).
func (s *Server) tryModel(ctx context.Context, w http.ResponseWriter, in http.Header, c *call, model string, ups []*provider, st *settlement, ex *exchange) (fallback, stop bool) {
	est := st.est
	body := s.bodyFor(c, model)
	cands := order(ups, s.cfg.MaxAttempts, s.broken)
	for i, u := range cands {
		var p upstream.Permit
		if g := s.guards.Of(u.cfg.Name); g != nil {
			gp, d := g.Acquire(ctx, upstream.Request{Tenant: c.caller.Tenant, Priority: c.priority, Deadline: c.deadline, Tokens: est.Prompt + est.Completion})
			if !d.Admitted() {
				ex.refused = &d
				s.m.guardRefusals.WithLabelValues(u.cfg.Name, d.Reason.String()).Inc()
				switch d.Reason {
				case priority.BreakerOpen:
					fallback = true
				case priority.Degraded:
					// The level's action: a cheaper model, or a refusal
					// (another upstream of the model may still serve it).
					fallback = u.cfg.DegradedAction(int(d.Level)) == policy.DegradeFallback
				default:
					// A client gone, or a saturated upstream: a cheaper
					// model is no answer to a full queue.
					return false, true
				}
				continue // another upstream of the model may take it
			}
			p = gp
		}
		sent, shortenedTo, callEst := body, int64(0), est
		if p.Shortened() {
			if sent, shortenedTo, callEst = s.shorten(c, u, body, est); sent == nil {
				p.Release(concurrency.Ignored)
				continue
			}
		}
		settleRoute, refusal := s.admitRoute(ctx, w, c, u, model, callEst, st.estOK)
		if refusal != nil {
			// Another upstream of the model may have room under its own
			// limit; a cheaper model is no answer to a hard limit.
			p.Settle(0)
			p.Release(concurrency.Ignored)
			ex.admission = refusal
			continue
		}
		c.attempts++
		c.upstream, ex.provider, ex.model = u.cfg.Name, u, model
		resp, done, err := s.attempt(callContext(ctx, c), u, u.url(c.operation(), model), sent, c.requestID, in)
		last := i == len(cands)-1
		if err != nil {
			p.Settle(0) // no answer: no tokens spent
			p.Release(outcomeOf(0, err, ctx.Err() != nil))
			settleAttempt(settleRoute, 0, err)
			ex.err = err
			if ctx.Err() != nil {
				return false, true // the client went away: nothing to fail over for
			}
			if !last {
				s.m.failovers.WithLabelValues(u.cfg.Name).Inc()
			}
			continue
		}
		if retryable(resp.StatusCode) {
			if !last {
				p.Settle(0)
				p.Release(concurrency.Failure)
				settleAttempt(settleRoute, resp.StatusCode, nil)
				s.m.failovers.WithLabelValues(u.cfg.Name).Inc()
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
				done()
				continue
			}
		}
		ex.resp, ex.done, ex.permit, ex.shortenedTo = resp, done, p, shortenedTo
		st.add(settleRoute) // settled with what the call used
		return false, true
	}
	return fallback, false
}

// shorten caps the output of a call a degradation level of u admits only
// shortened (degradation action shorten): the body to send, the cap, and
// the estimate with its completion capped as well. A body that cannot be
// re-encoded (scanRequest has read it, so only in theory) gives nil: the
// upstream is passed over.
func (s *Server) shorten(c *call, u *provider, body []byte, est estimate.Estimate) ([]byte, int64, estimate.Estimate) {
	limit := u.cfg.ShortenTo
	out, err := withMaxTokens(body, c.dialect, c.operation(), limit)
	if err != nil {
		s.log.Warn("degradation: cannot shorten the request; passing the upstream over", "upstream", u.cfg.Name, "err", err)
		return nil, 0, est
	}
	s.m.shortened.WithLabelValues(u.cfg.Name).Inc()
	est.Completion = min(est.Completion, limit)
	return out, limit, est
}

// operation is the path of c's operation under an upstream's base URL
// (/chat/completions): its endpoint's, whichever URL the client used (an
// Azure client's names its deployment too); a path the estimator does
// not know is passed as it is, without /v1.
func (c *call) operation() string {
	if c.dialect == policy.DialectGemini {
		return geminiOperation(c.endpoint, c.sse)
	}
	if c.ep != 0 {
		return strings.TrimPrefix(c.ep.String(), "/v1")
	}
	return strings.TrimPrefix(c.endpoint, "/v1")
}

// callContext is the context of c's call to a provider. A plain answer is
// read to its end whatever the client does — the provider bills a call
// it received, and only its answer says how much, so a client that
// disconnects cannot make its call unmetered — bounded by the upstream's
// timeout and the shutdown. A stream is cut with its client: cutting it
// stops the generation, and what was relayed until then is counted. A
// deferred task's run has no client: it is cut when its worker stops, and
// the task runs again on another gateway.
func callContext(ctx context.Context, c *call) context.Context {
	if c.req.Stream || deferredCaller(ctx) != nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// settleAttempt settles an attempt that got no answer worth relaying
// against the rules scoped by its model and upstream: the request was
// sent, no tokens were spent.
func settleAttempt(settle func(frontend.Settlement), status int, err error) {
	if settle == nil {
		return
	}
	set := frontend.Settlement{Status: status, Outcome: schemas.OutcomeError}
	if isTimeout(err) {
		set.Outcome = schemas.OutcomeTimeout
	}
	settle(set)
}

// broken reports whether u's breaker is open: dispatch tries it after the
// other upstreams of its model.
func (s *Server) broken(u *provider) bool {
	g := s.guards.Of(u.cfg.Name)
	return g != nil && g.BreakerState() == upstream.Open
}

// bodyFor is the body to send for model: the request's, asking for model
// when it is a fallback, and for the usage chunk of a stream whose client
// did not ask for it (the gateway needs it and removes it from what the
// client receives).
func (s *Server) bodyFor(c *call, model string) []byte {
	body := c.body
	if model != c.bodyModel && c.dialect != policy.DialectGemini { // Gemini's model is in the URL
		body = withModel(body, c.req, model)
	}
	if c.stripUsage() {
		rq, _ := scanRequest(body)
		body = withIncludeUsage(body, rq)
	}
	return body
}

// stripUsage reports whether the gateway asks c's stream for the usage
// chunk its client did not ask for, and removes it from the relay.
func (c *call) stripUsage() bool {
	return c.req.Stream && !c.req.IncludeUsage && (c.ep == estimate.ChatCompletions || c.ep == estimate.Completions)
}

// answerNoExchange answers a call dispatch got no answer for: every
// upstream that could serve it refused it on the request path (the guard's
// 429 or 503), the client went away, or the providers failed or timed out.
func (s *Server) answerNoExchange(w http.ResponseWriter, r *http.Request, c *call, st *settlement, ex exchange) {
	c.source = usageNone
	switch {
	case c.attempts == 0 && ex.admission != nil:
		refuseAdmission(w, c, st, ex.admission)
	case c.attempts == 0 && ex.refused != nil:
		c.mc.SetAttribute("refused_by", ex.refused.Reason.String())
		st.status = ex.refused.Status()
		if ex.refused.Reason == priority.Canceled {
			c.end(schemas.OutcomeRejected, codeClientClosed)
			return
		}
		priority.WriteRefusal(w, *ex.refused)
		c.end(schemas.OutcomeRejected, ex.refused.Reason.String())
	case r.Context().Err() != nil:
		c.end("", codeClientClosed) // nothing to fail over for, nobody's failure
	case isTimeout(ex.err):
		st.status = http.StatusGatewayTimeout
		writeError(w, st.status, "timeout", "upstream_timeout", fmt.Sprintf("The model provider (%s) did not answer in time.", c.upstream))
		c.end(schemas.OutcomeTimeout, "upstream_timeout")
	default:
		st.status = http.StatusBadGateway
		writeError(w, st.status, "api_error", "upstream_unavailable", fmt.Sprintf("The model provider (%s) could not be reached.", c.upstream))
		c.end(schemas.OutcomeError, "upstream_unavailable")
	}
}

// attempt sends one request to u, at target. done releases the attempt's context
// once its answer has been relayed.
func (s *Server) attempt(ctx context.Context, u *provider, target string, body []byte, requestID string, in http.Header) (*http.Response, func(), error) {
	actx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
	stop := context.AfterFunc(s.hardStop, cancel) // shutdown's end cuts every call
	done := func() { stop(); cancel() }
	req, err := http.NewRequestWithContext(actx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		done()
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sluice-gateway")
	req.Header.Set(headerRequestID, requestID)
	setUpstreamAuth(req, u, in)
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

// setUpstreamAuth sets the headers that authenticate the gateway to u in
// its dialect (Authorization: Bearer, Anthropic's x-api-key and
// anthropic-version, Azure's api-key, Google's x-goog-api-key) and the client's headers u's API
// reads: never the client's credential.
func setUpstreamAuth(req *http.Request, u *provider, in http.Header) {
	pass := []string{"Accept", "Openai-Beta"}
	if u.cfg.Dialect == policy.DialectAnthropic {
		if u.key != "" {
			req.Header.Set("X-Api-Key", u.key)
		}
		req.Header.Set("Anthropic-Version", anthropicVersion)
		pass = []string{"Accept", "Anthropic-Version", "Anthropic-Beta"}
	} else if u.cfg.Dialect == policy.DialectAzure && u.key != "" {
		req.Header.Set("Api-Key", u.key)
	} else if u.cfg.Dialect == policy.DialectGemini && u.key != "" {
		req.Header.Set("X-Goog-Api-Key", u.key)
	} else if u.key != "" {
		req.Header.Set("Authorization", "Bearer "+u.key)
	}
	for _, k := range pass {
		if v := in.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
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
