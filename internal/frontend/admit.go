package frontend

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// Admitter is the request-path limiter the gateway asks before each
// upstream call, after the flag check and the estimate: the place where
// sdk/go/admission (Redis Lua token buckets and windows, leases,
// priority) plugs in. The gateway implements no limit itself; without an
// Admitter every request that passes the flags is admitted.
//
// Admit is called once per request, before the first upstream attempt,
// with what the rules may scope by and the estimate to debit. It must
// honour ctx and decide the fail mode itself when its store is away (it
// answers; the gateway never blocks on it beyond ctx).
type Admitter interface {
	Admit(ctx context.Context, req AdmitRequest) Admission
}

// AdmitRequest is what an admission decision is made on.
type AdmitRequest struct {
	Tenant, Model, User, APIKeyID string
	// Session is the agent session or conversation the call belongs to
	// (the usage event's session_id), for limits scoped by session.
	Session string
	// Endpoint is the path called (/v1/chat/completions …).
	Endpoint string
	// Upstream is the upstream a routing front end chose for this attempt
	// (Limits.Route); empty before routing, where a rule scoped by
	// upstream reads it as the model.
	Upstream string
	// Priority is the request's class: the key's default, or what the
	// caller chose when its key may choose.
	Priority schemas.Priority
	// EstimatePrompt and EstimateCompletion are the tokens the call is
	// expected to use (sdk/go/estimate, margin included); their sum is
	// what to debit now and settle after.
	EstimatePrompt, EstimateCompletion int64
	// Estimated is false when the body could not be estimated (the
	// figures are then zero).
	Estimated bool
	// EventID is the call's usage event id, shared by its estimate and
	// settlement events, for an admission that records its debits.
	EventID string
	// Deadline is the caller's own deadline (zero: none): a request that
	// may wait for a limit never waits past it.
	Deadline time.Time
}

// Admission is an Admitter's answer.
type Admission struct {
	// Refused, when not nil, is answered instead of calling the upstream.
	Refused *Refusal
	// Limits are sent as OpenAI's x-ratelimit-* headers, with the answer
	// or the refusal.
	Limits []ratelimit.Limit
	// Settle, when not nil, is called exactly once after an admitted call,
	// with what it used (zero tokens for a call that failed before the
	// provider billed it), so the debit can be corrected.
	Settle func(Settlement)
}

// Refusal is what a refused request is answered: Status (429 for a limit
// that lifts by waiting), OpenAI's error body naming the limit, and
// Retry-After.
type Refusal struct {
	Status     int
	Error      ratelimit.Error
	RetryAfter time.Duration
	// Rule names the admission rule that refused, for the usage event of
	// the refusal (middleware.AdmissionRefusalEvent); empty when the
	// tenant failed closed with Redis away, or for a request admission
	// could not judge (Status 400).
	Rule string
}

// Settlement is the end of an admitted call.
type Settlement struct {
	Usage middleware.Usage
	// Model is the model that served the call (a fallback's, say); empty
	// means the one admitted. Rules counting cost price Usage at its price.
	Model string
	// Outcome and Status are the usage event's.
	Outcome schemas.Outcome
	Status  int
}
