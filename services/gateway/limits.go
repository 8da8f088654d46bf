package gateway

import (
	"context"
	"net/http"

	"github.com/sluicehq/sluice/gateway/admission"
)

// LimiterAdmitter answers the gateway's admission hook with
// gateway/admission: the policy's limits (and its hard one-minute quotas)
// checked in one Redis round trip or from local leases before the call,
// the estimate settled with what the call used after it.
type LimiterAdmitter struct{ L *admission.Limiter }

// Admit implements Admitter.
func (a LimiterAdmitter) Admit(ctx context.Context, req AdmitRequest) Admission {
	t, err := a.L.Admit(ctx, admission.Request{ID: req.EventID, Tenant: req.Tenant, Model: req.Model, User: req.User,
		Key: req.APIKeyID, Endpoint: req.Endpoint, Priority: admission.ParsePriority(string(req.Priority)),
		PromptTokens: req.EstimatePrompt, CompletionTokens: req.EstimateCompletion})
	if err != nil {
		// A request the limiter cannot judge names the bound it broke.
		e := admission.Error(admission.Decision{})
		e.Type, e.Code, e.Message = "invalid_request_error", "admission_refused", err.Error()
		return Admission{Refused: &Refusal{Status: http.StatusBadRequest, Error: e}}
	}
	d := t.Decision
	if !d.Allowed {
		return Admission{Limits: admission.Headers(d), Refused: &Refusal{Status: admission.Status(d), Error: admission.Error(d), RetryAfter: d.RetryAfter}}
	}
	return Admission{Limits: admission.Headers(d), Settle: func(s Settlement) {
		// The client may be gone; the correction must still land.
		_ = t.Settle(context.WithoutCancel(ctx), admission.Usage{PromptTokens: s.Usage.PromptTokens, CompletionTokens: s.Usage.CompletionTokens})
	}}
}
