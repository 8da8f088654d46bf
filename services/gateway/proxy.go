package gateway

import (
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// proxy runs a call the flags let through, after its estimate, in stages:
//
//   - admit (admit.go): the policy's limits and the tenant's soft quotas,
//     which decide whether it runs and on which models;
//   - dispatch (dispatch.go): each model in turn, each of its upstreams in
//     turn, through the upstream's guard, failing over until one answers;
//   - relay (relay.go, stream.go): the answer to the client, and the usage
//     it reports (or the text it generated, counted);
//   - settle (settle.go): when proxy returns, what each stage took is given
//     back against what the call used, and the middleware emits the
//     settlement with the usage reported to it.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	c := callFrom(r.Context())
	c.mc = middleware.CallFrom(r.Context()) // never nil on the API paths
	est, estOK := c.mc.Estimate()
	st := &settlement{c: c, est: est, estOK: estOK}
	defer st.run()

	endAdmit := s.stage(r.Context(), c, "sluice.admit")
	models, ok := s.admit(w, r, c, est, estOK, st)
	endAdmit()
	if !ok {
		return
	}
	endDispatch := s.stage(r.Context(), c, "sluice.dispatch")
	ex := s.dispatch(r.Context(), w, r.Header, c, models, st)
	endDispatch()
	s.served(w, c, ex)
	if ex.resp == nil {
		s.answerNoExchange(w, r, c, st, ex)
		return
	}
	st.exchange = &ex
	s.relay(w, r, c, st, ex, est, estOK)
}

// served tells the settlement and the client which upstream and model
// served the call, after dispatch.
func (s *Server) served(w http.ResponseWriter, c *call, ex exchange) {
	c.mc.SetProvider(c.upstream)
	if c.attempts > 1 {
		c.mc.SetAttribute("attempts", strconv.Itoa(c.attempts))
	}
	if ex.model != c.req.Model {
		c.mc.SetServedModel(ex.model)
		s.m.fallbacks.WithLabelValues(c.route, ex.model).Inc()
	}
	if c.attempts > 0 {
		c.served = ex.model
		w.Header().Set(HeaderServedModel, ex.model)
	}
	if ex.shortenedTo > 0 {
		limit := strconv.FormatInt(ex.shortenedTo, 10)
		w.Header().Set(HeaderMaxTokens, limit)
		c.mc.SetAttribute("shortened_to", limit)
	}
}

// HeaderServedModel names, on every answer an upstream gave, the model
// that served it: the one asked for, or a cheaper fallback the policy
// names when the asked model's upstream is broken or degraded or the
// tenant is past a soft limit.
const HeaderServedModel = "X-Sluice-Served-Model"

// softFlags is the part of the Checker (checker.Checker.Over) that finds
// a tenant's soft-quota flag.
type softFlags interface {
	Over(tenant, model, apiKeyID string) *flags.Flag
}

// admitRequest is what the admission hooks decide c on.
func admitRequest(c *call, est estimate.Estimate, estOK bool) frontend.AdmitRequest {
	return frontend.AdmitRequest{Tenant: c.caller.Tenant, Model: c.req.Model, User: c.user, APIKeyID: c.caller.KeyID, Session: c.session,
		Endpoint: c.endpoint, Priority: c.priority, EstimatePrompt: est.Prompt, EstimateCompletion: est.Completion,
		Estimated: estOK, EventID: c.eventID, Deadline: c.deadline}
}
