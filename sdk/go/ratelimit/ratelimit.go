// Package ratelimit writes rate-limit answers the way OpenAI's API does,
// so that clients built for OpenAI (its SDKs' retry logic, LiteLLM, go-openai's
// RateLimitHeaders) read a Sluice gateway's answers unchanged. Every part of
// the SDK that limits a request — the flag middleware, admission — writes
// its headers and its 429 through here, so there is one format.
//
// The formats:
//
//   - x-ratelimit-limit-requests, x-ratelimit-remaining-requests and
//     x-ratelimit-reset-requests, and the same three for tokens: limit and
//     remaining are integers; a reset is the time until the limit is whole
//     again as a duration in Go's syntax rounded up to the millisecond
//     ("12ms", "1s", "6m0s", "1h0m0s"), never a Unix time (FormatReset).
//   - Retry-After: whole seconds, rounded up, at least 1 (RetryAfter).
//   - The body: {"error":{"message":…,"type":…,"param":null,"code":…}},
//     with an optional "sluice" member carrying the limit's numbers for
//     clients that want them (WriteError). OpenAI's own codes are
//     "rate_limit_exceeded" (type "requests" or "tokens") for a rate limit
//     and "insufficient_quota" (type "insufficient_quota") for a spent
//     quota; clients treat the latter as not worth retrying soon.
package ratelimit

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
)

// The OpenAI rate-limit header names.
const (
	HeaderLimitRequests     = "x-ratelimit-limit-requests"
	HeaderRemainingRequests = "x-ratelimit-remaining-requests"
	HeaderResetRequests     = "x-ratelimit-reset-requests"
	HeaderLimitTokens       = "x-ratelimit-limit-tokens"
	HeaderRemainingTokens   = "x-ratelimit-remaining-tokens"
	HeaderResetTokens       = "x-ratelimit-reset-tokens"
	HeaderRetryAfter        = "Retry-After"
)

// The error types and codes OpenAI uses for refusals of this kind.
const (
	// CodeRateLimitExceeded is the code of a rate-limit refusal; its type
	// is TypeRequests or TypeTokens, the unit of the limit.
	CodeRateLimitExceeded = "rate_limit_exceeded"
	TypeRequests          = "requests"
	TypeTokens            = "tokens"
	// CodeInsufficientQuota is type and code of a refusal because a
	// quota (a period's tokens or budget) is spent.
	CodeInsufficientQuota = "insufficient_quota"
)

// FormatReset formats the time until a limit resets as OpenAI does: Go's
// duration syntax rounded up to the millisecond, so a client that waits
// that long is never early ("999µs" becomes "1ms", 1.5 s "1.5s", six
// minutes "6m0s"); zero or less is "0s".
func FormatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d.String()
}

// RetryAfter returns the Retry-After value for d: whole seconds rounded
// up, at least 1, since 0 would invite an immediate retry.
func RetryAfter(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// Unit is what a limit counts.
type Unit uint8

// The units of OpenAI's header trios.
const (
	Requests Unit = iota + 1
	Tokens
)

// Limit is where a caller stands against one limit.
type Limit struct {
	Unit Unit
	// Limit is the limit's size; Remaining what is left of it now (less
	// than zero is sent as 0).
	Limit, Remaining int64
	// Reset is the time until the limit is whole again.
	Reset time.Duration
}

// SetHeaders sets l's trio of headers (limit, remaining, reset) in h. A
// Limit with no Unit sets nothing.
func SetHeaders(h http.Header, l Limit) {
	var limit, remaining, reset string
	switch l.Unit {
	case Requests:
		limit, remaining, reset = HeaderLimitRequests, HeaderRemainingRequests, HeaderResetRequests
	case Tokens:
		limit, remaining, reset = HeaderLimitTokens, HeaderRemainingTokens, HeaderResetTokens
	default:
		return
	}
	// Set canonicalises the names (X-Ratelimit-Limit-Tokens); header
	// names are case-insensitive on the wire and HTTP/2 lower-cases them,
	// and in-process readers using Header.Get find them either way.
	h.Set(limit, strconv.FormatInt(l.Limit, 10))
	h.Set(remaining, strconv.FormatInt(max(0, l.Remaining), 10))
	h.Set(reset, FormatReset(l.Reset))
}

// Error is the "error" member of an OpenAI error body.
type Error struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	// Sluice, when not nil, is encoded as the "sluice" member: the
	// numbers of the limit that refused, for clients that want them.
	Sluice any `json:"sluice,omitempty"`
}

// Body is an OpenAI error body.
type Body struct {
	Error Error `json:"error"`
}

// WriteError answers status with e as an OpenAI error body. A positive
// retryAfter also sets Retry-After (RetryAfter's seconds). Headers set on
// w before the call (SetHeaders) are sent with it.
func WriteError(w http.ResponseWriter, status int, e Error, retryAfter time.Duration) {
	h := w.Header()
	if retryAfter > 0 {
		h.Set(HeaderRetryAfter, strconv.FormatInt(RetryAfter(retryAfter), 10))
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Body{Error: e})
}

// WriteTooManyRequests answers 429 with e and Retry-After for retryAfter,
// and, for each limit given, its header trio.
func WriteTooManyRequests(w http.ResponseWriter, e Error, retryAfter time.Duration, limits ...Limit) {
	for _, l := range limits {
		SetHeaders(w.Header(), l)
	}
	WriteError(w, http.StatusTooManyRequests, e, retryAfter)
}
