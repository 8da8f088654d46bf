package admission

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// Headers returns the rate-limit header trios of d (requests, tokens; each
// when a rule of that kind applied), for ratelimit.SetHeaders or a caller
// that merges them with other limiters' (the flag middleware's).
//
// On a leased admission, remaining is what Redis said at this gateway's
// last round trip for the rule plus the lease this gateway still holds: an
// estimate that lags by at most the lease horizon.
func Headers(d Decision) []ratelimit.Limit {
	var out []ratelimit.Limit
	if d.Requests.Limit > 0 || d.Unit == Requests && d.Rule != "" {
		out = append(out, ratelimit.Limit{Unit: ratelimit.Requests, Limit: d.Requests.Limit, Remaining: d.Requests.Remaining, Reset: d.Requests.Reset})
	}
	if d.Tokens.Limit > 0 || d.Unit.Tokens() && d.Rule != "" {
		out = append(out, ratelimit.Limit{Unit: ratelimit.Tokens, Limit: d.Tokens.Limit, Remaining: d.Tokens.Remaining, Reset: d.Tokens.Reset})
	}
	return out
}

// WriteHeaders sets OpenAI's x-ratelimit-*-requests headers from the
// tightest requests rule of d and the x-ratelimit-*-tokens headers from the
// tightest tokens rule, in sdk/go/ratelimit's formats (integers; the reset
// as a duration such as "1s" or "6m0s", never a Unix time).
func WriteHeaders(h http.Header, d Decision) {
	for _, l := range Headers(d) {
		ratelimit.SetHeaders(h, l)
	}
}

// Detail names the refusing rule exactly.
type Detail struct {
	Kind      string            `json:"kind"` // "admission"
	Rule      string            `json:"rule"`
	Scope     map[string]string `json:"scope"`
	Unit      string            `json:"unit"`
	Algorithm string            `json:"algorithm"`
	Limit     int64             `json:"limit"`
	// WindowSeconds is a sliding window's length; RatePerSecond a bucket's
	// refill.
	WindowSeconds     float64 `json:"window_seconds,omitempty"`
	RatePerSecond     float64 `json:"rate_per_second,omitempty"`
	Requested         int64   `json:"requested"`
	Available         int64   `json:"available"`
	RetryAfterSeconds int64   `json:"retry_after_seconds,omitempty"`
	// TooLarge is set when the request can never fit the rule.
	TooLarge bool `json:"too_large,omitempty"`
}

// Status is the HTTP status of a refusal: 429 when a rule refused, 503 when
// Redis was unreachable and the tenant fails closed.
func Status(d Decision) int {
	if d.Path == PathUnavailable {
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// unavailableRetry is the Retry-After of a fail-closed refusal: about when
// a probe will have found Redis again if it was a blip.
const unavailableRetry = time.Second

// Error returns the OpenAI error object of refusal d: type "tokens" or
// "requests" and code "rate_limit_exceeded", a message naming the rule, its
// scope, the limit and when it frees up, and the numbers in "sluice"
// (a *Detail). A fail-closed refusal is type "service_unavailable", code
// "admission_unavailable".
func Error(d Decision) ratelimit.Error {
	if d.Path == PathUnavailable {
		return ratelimit.Error{Type: "service_unavailable", Code: "admission_unavailable",
			Message: "Usage limits cannot be checked right now (the rate-limit store did not answer in time) and this tenant fails closed; retry later."}
	}
	det := &Detail{Kind: "admission", Rule: d.Rule, Scope: scopeMap(d.Scope), Unit: d.Unit.String(), Algorithm: d.Algorithm.String(),
		Limit: d.Limit, Requested: d.Requested, Available: d.Available, TooLarge: d.Never}
	if d.Algorithm == SlidingWindow {
		det.WindowSeconds = d.Window.Seconds()
	} else {
		det.RatePerSecond = d.Rate
	}
	if !d.Never {
		det.RetryAfterSeconds = ratelimit.RetryAfter(d.RetryAfter)
	}
	typ := ratelimit.TypeRequests
	if d.Unit.Tokens() {
		typ = ratelimit.TypeTokens
	}
	return ratelimit.Error{Type: typ, Code: ratelimit.CodeRateLimitExceeded, Sluice: det, Message: message(d)}
}

func message(d Decision) string {
	per := ""
	switch d.Algorithm {
	case SlidingWindow:
		per = fmt.Sprintf("%s per %s", quantity(d.Limit, d.Unit), d.Window)
	case CalendarPeriod:
		per = fmt.Sprintf("%s per calendar period", quantity(d.Limit, d.Unit))
	default:
		per = fmt.Sprintf("%s burst, refilling %s per second", quantity(d.Limit, d.Unit), strconv.FormatFloat(d.Rate, 'f', -1, 64))
	}
	if d.Never {
		return fmt.Sprintf("Request too large for rule %s (%s): limit %s, requested %s.", d.Rule, d.Scope, per, amount(d.Requested, d.Unit))
	}
	return fmt.Sprintf("Rate limit reached for rule %s (%s): limit %s, available %s, requested %s. Please try again in %s.",
		d.Rule, d.Scope, per, amount(d.Available, d.Unit), amount(d.Requested, d.Unit), ratelimit.FormatReset(d.RetryAfter))
}

// quantity is n units of u as a message says it: "5000 total_tokens",
// "12.5 in cost" (money in the price table's currency).
func quantity(n int64, u Unit) string {
	if u == Cost {
		return amount(n, u) + " in cost"
	}
	return fmt.Sprintf("%d %s", n, u)
}

// amount is n in u's own terms: money as currency with cents (Cost
// counts millionths, shown without trailing zeros), anything else as the
// integer it is.
func amount(n int64, u Unit) string {
	if u == Cost {
		return strconv.FormatFloat(float64(n)/CostScale, 'f', -1, 64)
	}
	return strconv.FormatInt(n, 10)
}

func scopeMap(s Scope) map[string]string {
	m := map[string]string{}
	for _, dim := range s.dims() {
		if *dim.v != "" {
			m[dim.name] = *dim.v
		}
	}
	return m
}

// RetryAfter is the wait a refusal d tells the client: when the request
// would fit; a second when Redis was unreachable and the tenant fails
// closed, or when the time is unknown; 0 (no Retry-After) when the request
// can never fit.
func RetryAfter(d Decision) time.Duration {
	switch {
	case d.Path == PathUnavailable:
		return unavailableRetry
	case d.Never:
		return 0
	case d.RetryAfter <= 0:
		return time.Second
	}
	return d.RetryAfter
}

// WriteRefusal answers a refused request through sdk/go/ratelimit:
// Status(d), the rate-limit headers, Retry-After (RetryAfter(d) in whole
// seconds, at least 1; none when the request can never fit) and the body
// of Error(d).
func WriteRefusal(w http.ResponseWriter, d Decision) {
	WriteHeaders(w.Header(), d)
	ratelimit.WriteError(w, Status(d), Error(d), RetryAfter(d))
}
