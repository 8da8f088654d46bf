package admission

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// OpenAI's rate-limit headers, which every admitted and refused answer
// carries for the tightest rule of each kind.
const (
	HeaderLimitRequests     = "X-Ratelimit-Limit-Requests"
	HeaderRemainingRequests = "X-Ratelimit-Remaining-Requests"
	HeaderResetRequests     = "X-Ratelimit-Reset-Requests"
	HeaderLimitTokens       = "X-Ratelimit-Limit-Tokens"
	HeaderRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens       = "X-Ratelimit-Reset-Tokens"
)

// WriteHeaders sets the x-ratelimit-*-requests headers from d.Requests and
// the x-ratelimit-*-tokens headers from d.Tokens, each when a rule of that
// kind applied, in OpenAI's formats: integers, and the reset as a duration
// such as "1s", "6m0s" or "20ms" (rounded up to the millisecond), never a
// Unix time.
//
// On a leased admission, remaining is what Redis said at this gateway's
// last round trip for the rule plus the lease this gateway still holds: an
// estimate that lags by at most the lease horizon.
func WriteHeaders(h http.Header, d Decision) {
	if d.Requests.Limit > 0 || d.Unit == Requests && d.Rule != "" {
		h.Set(HeaderLimitRequests, strconv.FormatInt(d.Requests.Limit, 10))
		h.Set(HeaderRemainingRequests, strconv.FormatInt(max(d.Requests.Remaining, 0), 10))
		h.Set(HeaderResetRequests, FormatReset(d.Requests.Reset))
	}
	if d.Tokens.Limit > 0 || d.Unit.Tokens() && d.Rule != "" {
		h.Set(HeaderLimitTokens, strconv.FormatInt(d.Tokens.Limit, 10))
		h.Set(HeaderRemainingTokens, strconv.FormatInt(max(d.Tokens.Remaining, 0), 10))
		h.Set(HeaderResetTokens, FormatReset(d.Tokens.Reset))
	}
}

// FormatReset renders a reset time as OpenAI does: a Go duration rounded up
// to the millisecond ("0s", "20ms", "1s", "1.5s", "6m0s").
func FormatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	d = (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	return d.String()
}

// ErrorBody is the OpenAI-style error document of a refusal.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is OpenAI's error object; Sluice says which rule refused.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	Sluice  *Detail `json:"sluice,omitempty"`
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

// Body returns the error document of refusal d.
func Body(d Decision) ErrorBody {
	if d.Path == PathUnavailable {
		return ErrorBody{Error: ErrorDetail{Type: "service_unavailable", Code: "admission_unavailable",
			Message: "Usage limits cannot be checked right now (the rate-limit store did not answer in time) and this tenant fails closed; retry later."}}
	}
	det := &Detail{Kind: "admission", Rule: d.Rule, Scope: scopeMap(d.Scope), Unit: d.Unit.String(), Algorithm: d.Algorithm.String(),
		Limit: d.Limit, Requested: d.Requested, Available: d.Available, TooLarge: d.Never}
	if d.Algorithm == SlidingWindow {
		det.WindowSeconds = d.Window.Seconds()
	} else {
		det.RatePerSecond = d.Rate
	}
	if !d.Never {
		det.RetryAfterSeconds = retrySeconds(d.RetryAfter)
	}
	typ := "requests"
	if d.Unit.Tokens() {
		typ = "tokens"
	}
	return ErrorBody{Error: ErrorDetail{Type: typ, Code: "rate_limit_exceeded", Sluice: det, Message: message(d)}}
}

func message(d Decision) string {
	per := ""
	if d.Algorithm == SlidingWindow {
		per = fmt.Sprintf("%d %s per %s", d.Limit, d.Unit, d.Window)
	} else {
		per = fmt.Sprintf("%d %s burst, refilling %s per second", d.Limit, d.Unit, strconv.FormatFloat(d.Rate, 'f', -1, 64))
	}
	if d.Never {
		return fmt.Sprintf("Request too large for rule %s (%s): limit %s, requested %d.", d.Rule, d.Scope, per, d.Requested)
	}
	return fmt.Sprintf("Rate limit reached for rule %s (%s): limit %s, available %d, requested %d. Please try again in %s.",
		d.Rule, d.Scope, per, d.Available, d.Requested, FormatReset(d.RetryAfter))
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

func retrySeconds(d time.Duration) int64 {
	return max(int64(math.Ceil(d.Seconds())), 1)
}

// WriteRefusal answers a refused request: Status(d), Retry-After (whole
// seconds, at least 1; none when the request can never fit), the rate-limit
// headers and the JSON body of Body(d).
func WriteRefusal(w http.ResponseWriter, d Decision) {
	h := w.Header()
	WriteHeaders(h, d)
	switch {
	case d.Path == PathUnavailable:
		h.Set("Retry-After", strconv.FormatInt(retrySeconds(unavailableRetry), 10))
	case !d.Never:
		h.Set("Retry-After", strconv.FormatInt(retrySeconds(d.RetryAfter), 10))
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(Status(d))
	_ = json.NewEncoder(w).Encode(Body(d))
}
