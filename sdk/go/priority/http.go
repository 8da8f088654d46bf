package priority

import (
	"net/http"

	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// Refusal is the "sluice" member of a refusal's body: the numbers a client
// may act on.
type Refusal struct {
	Reason string `json:"reason"`
	Class  string `json:"priority"`
	// Level is the degradation level (degraded only).
	Level int `json:"degradation_level,omitempty"`
	// EstimatedWaitMS is the queue's estimate that refused (deadline).
	EstimatedWaitMS int64 `json:"estimated_wait_ms,omitempty"`
	// WaitedMS is how long the request waited before it was refused.
	WaitedMS int64 `json:"waited_ms,omitempty"`
}

// WriteRefusal answers a refused request as OpenAI's API would, through
// package ratelimit: d's status, Retry-After in whole seconds, and an
// error body whose message is d.Message(). A 429 (the tenant's own
// concurrency) has type "requests" and code "rate_limit_exceeded", the
// pair OpenAI clients back off on; a 503 has type "server_error" and the
// reason as its code ("queue_full", "shed", "deadline", "expired",
// "degraded", "breaker_open"), so that a degraded refusal says so. An
// admitted or canceled Decision writes nothing.
func WriteRefusal(w http.ResponseWriter, d Decision) {
	if d.Reason == Admitted || d.Reason == Canceled {
		return
	}
	e := ratelimit.Error{Message: d.Message(), Type: "server_error", Code: d.Reason.String(), Sluice: Refusal{
		Reason: d.Reason.String(), Class: string(d.Priority), Level: int(d.Level),
		EstimatedWaitMS: d.Estimate.Milliseconds(), WaitedMS: d.Waited.Milliseconds(),
	}}
	if d.Status() == http.StatusTooManyRequests {
		e.Type, e.Code = ratelimit.TypeRequests, ratelimit.CodeRateLimitExceeded
	}
	ratelimit.WriteError(w, d.Status(), e, d.RetryAfter)
}
