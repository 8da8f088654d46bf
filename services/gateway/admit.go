package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// admit is the proxy's first stage: the policy's limits (the Admitter)
// decide whether c runs at all, answering a refusal in OpenAI's 429 shape
// naming the rule; then the tenant's soft quotas decide which models may
// serve it (modelsFor). What each took is settled by st when the call
// ends. ok is false when c was refused and answered.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, c *call, est estimate.Estimate, estOK bool, st *settlement) (models []string, ok bool) {
	if s.admitter != nil {
		adm := s.admitter.Admit(r.Context(), admitRequest(c, est, estOK))
		for _, l := range adm.Limits {
			ratelimit.SetHeaders(w.Header(), l)
		}
		if f := adm.Refused; f != nil {
			refuseAdmission(w, c, st, f)
			return nil, false
		}
		st.add(adm.Settle)
	}
	models, settleSoft := s.modelsFor(r.Context(), c, est, estOK)
	st.add(settleSoft)
	return models, true
}

// refuseAdmission answers c with admission's refusal f.
func refuseAdmission(w http.ResponseWriter, c *call, st *settlement, f *frontend.Refusal) {
	c.mc.SetAttribute("refused_by", "admission")
	c.source = usageNone
	st.status = f.Status
	if st.status < 400 || st.status > 599 {
		st.status = http.StatusTooManyRequests
	}
	c.refuse(w, st.status, f.Error, f.RetryAfter)
}

// admitRoute asks the rules scoped by model or upstream (Limits.Route)
// whether c may go to u as model, once dispatch has chosen them: a
// fallback model's rules, an upstream account's, are charged for the calls
// they serve, and the attempt's own id keeps its settlement apart from the
// call's other attempts. settle is nil when no such rules are configured;
// refused, when not nil, is why c may not go there.
func (s *Server) admitRoute(ctx context.Context, w http.ResponseWriter, c *call, u *provider, model string, est estimate.Estimate, estOK bool) (
	settle func(frontend.Settlement), refused *frontend.Refusal) {
	if s.route == nil {
		return nil, nil
	}
	req := admitRequest(c, est, estOK)
	req.Model, req.Upstream, req.EventID = model, u.cfg.Name, c.eventID+"/"+strconv.Itoa(c.attempts+1)
	adm := s.route.Admit(ctx, req)
	for _, l := range adm.Limits {
		ratelimit.SetHeaders(w.Header(), l)
	}
	return adm.Settle, adm.Refused
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
	adm := s.soft.Admit(ctx, admitRequest(c, est, estOK))
	if adm.Refused != nil {
		s.m.softOver.Inc()
		return models[1:], nil
	}
	return models, adm.Settle
}

// settlement gives back, once the call has ended, what its stages took:
// the admission debits (against what the call used) and the upstream's
// guard permit (its slot, its token share, the outcome its limit and
// breaker learn). status is the status the proxy answered.
type settlement struct {
	c        *call
	est      estimate.Estimate
	estOK    bool // est came from the body (else the defaults)
	status   int
	settles  []func(frontend.Settlement)
	exchange *exchange // the answer relayed, nil without one
}

// add registers a settle hook; nil is ignored.
func (st *settlement) add(f func(frontend.Settlement)) {
	if f != nil {
		st.settles = append(st.settles, f)
	}
}

// run settles the exchange first (its slot frees the upstream for the
// next request at once), then the admission debits.
func (st *settlement) run() {
	set := st.c.settlement(st.status, st.est)
	if ex := st.exchange; ex != nil {
		ex.resp.Body.Close()
		ex.done()
		ex.permit.Settle(set.Usage.PromptTokens + set.Usage.CompletionTokens)
		ex.permit.Release(outcomeOf(st.status, outcomeErr(st.c), st.c.cut()))
	}
	for i := len(st.settles) - 1; i >= 0; i-- {
		st.settles[i](set)
	}
}

// cut reports whether c was cut before it completed, by its client or
// the shutdown: nobody's failure.
func (c *call) cut() bool { return c.code == codeClientClosed || c.code == codeShutdown }

// settlement is what an admitted call used, for an Admitter's Settle:
// status is the one answered.
func (c *call) settlement(status int, est estimate.Estimate) frontend.Settlement {
	set := frontend.Settlement{Status: status, Outcome: schemas.OutcomeOK, Model: c.served}
	switch {
	case c.outcome == schemas.OutcomeTimeout:
		set.Outcome = schemas.OutcomeTimeout
	case status >= 500 || c.outcome == schemas.OutcomeError:
		set.Outcome = schemas.OutcomeError
	case c.cut():
		set.Outcome = ""
	}
	switch {
	case c.source.billed():
		set.Usage = c.usage
	case c.source == usageEstimate:
		set.Usage.PromptTokens, set.Usage.CompletionTokens = est.Prompt, est.Completion
	}
	return set
}

// outcomeErr is the error outcomeOf reads for c: a relay that broke off
// or timed out failed on the provider's side.
func outcomeErr(c *call) error {
	if c.outcome == schemas.OutcomeTimeout || c.outcome == schemas.OutcomeError {
		return errUpstreamBroke
	}
	return nil
}

var errUpstreamBroke = errors.New("the upstream's answer broke off")
