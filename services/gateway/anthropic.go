package gateway

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/providerusage"
)

// Anthropic's Messages API, passed through natively: the body goes to an
// upstream of dialect anthropic as the client sent it, the answer comes
// back as the provider sent it, and the gateway reads the usage Anthropic
// reports (usage in a message; message_start and message_delta in a
// stream). Only the gateway's own answers change shape: its refusals are
// written as OpenAI errors everywhere in the request path (the flags,
// admission, guards, intake), and nativeWriter (dialect.go) rewrites them into
// Anthropic's error body and rate-limit headers, so that Anthropic's
// SDKs raise their own errors (a 429 their RateLimitError).

// Paths of Anthropic's API the gateway serves.
const (
	pathMessages    = "/v1/messages"
	pathCountTokens = "/v1/messages/count_tokens"
)

// anthropicVersion is the anthropic-version sent to an upstream when the
// client sent none: the API's only stable version.
const anthropicVersion = "2023-06-01"

// anthropicDoc is the part of a message, or of one streamed event, that
// says what was used or generated.
type anthropicDoc struct {
	Type    string                   `json:"type"`
	Usage   *providerusage.Anthropic `json:"usage"`
	Message *struct {
		Usage *providerusage.Anthropic `json:"usage"`
	} `json:"message"`
	Content      []anthropicBlock `json:"content"`
	ContentBlock *anthropicBlock  `json:"content_block"`
	Delta        *struct {
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
}

type anthropicBlock struct {
	Text     string          `json:"text"`
	Thinking string          `json:"thinking"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
}

// count returns the tokens of the text d generated, with fam's weights.
func (d *anthropicDoc) count(fam estimate.Family) int64 {
	var n int64
	add := func(s string) {
		if s != "" {
			n += estimate.Count(fam, s)
		}
	}
	blocks := d.Content
	if d.ContentBlock != nil {
		blocks = append(blocks, *d.ContentBlock)
	}
	for _, b := range blocks {
		add(b.Text)
		add(b.Thinking)
		add(b.Name)
		if len(b.Input) > 2 { // a tool call's arguments; {} at a block's start
			add(string(b.Input))
		}
	}
	if d.Delta != nil {
		add(d.Delta.Text)
		add(d.Delta.Thinking)
		add(d.Delta.PartialJSON)
	}
	return n
}

// anthropicWhole reads the usage of a whole message: the provider's, or
// prompt and the generated text counted when it reports none. ok is false
// for an answer that is not JSON.
func anthropicWhole(data []byte, fam estimate.Family, prompt int64) (u middleware.Usage, src usageSource, ok bool) {
	var d anthropicDoc
	if json.Unmarshal(data, &d) != nil {
		return u, usageEstimate, false
	}
	if d.Usage != nil {
		return d.Usage.Usage(), usageReported, true
	}
	return middleware.Usage{PromptTokens: prompt, CompletionTokens: d.count(fam), Counted: true}, usageCounted, true
}

// anthropicEvent reads one event of an Anthropic stream: message_start
// gives the prompt (and the cache) and the first output count,
// message_delta the cumulative output (and, from newer API versions, the
// input again), and the deltas the text to count should the stream end
// before message_delta.
func (st *streamState) anthropicEvent(data []byte) {
	var d anthropicDoc
	if json.Unmarshal(data, &d) != nil {
		return
	}
	switch d.Type {
	case "message_start":
		if d.Message != nil && d.Message.Usage != nil {
			u := d.Message.Usage.Usage()
			st.reported = &u
		}
	case "message_delta":
		if d.Usage == nil {
			break
		}
		if st.reported == nil {
			st.reported = &middleware.Usage{}
		}
		st.reported.CompletionTokens = d.Usage.OutputTokens
		if in := d.Usage.Usage(); in.PromptTokens > 0 {
			st.reported.PromptTokens, st.reported.CachedTokens, st.reported.CacheWriteTokens =
				in.PromptTokens, in.CachedTokens, in.CacheWriteTokens
		}
		st.final = true
	default:
		st.counted += d.count(st.fam)
	}
}

// anthropicShape writes the gateway's errors on Anthropic's routes as
// Anthropic's error body, and turns OpenAI's x-ratelimit-* headers into
// Anthropic's anthropic-ratelimit-* on every answer.
type anthropicShape struct{}

func (anthropicShape) errorBody(status int, msg string) []byte {
	out, _ := json.Marshal(anthropicError{Type: "error", Error: anthropicErrorBody{Type: anthropicErrorType(status), Message: msg}})
	return out
}

func (anthropicShape) headers(h http.Header, now time.Time) { anthropicRateHeaders(h, now) }

type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicErrorType is the error type Anthropic's API gives status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// anthropicRateHeaders replaces OpenAI's x-ratelimit-* headers in h by
// Anthropic's: anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset},
// the reset an RFC 3339 time rather than a duration.
func anthropicRateHeaders(h http.Header, now time.Time) {
	for _, unit := range []string{"requests", "tokens"} {
		limit, remaining, reset := "X-Ratelimit-Limit-"+unit, "X-Ratelimit-Remaining-"+unit, "X-Ratelimit-Reset-"+unit
		if v := h.Get(limit); v != "" {
			h.Set("Anthropic-Ratelimit-"+unit+"-Limit", v)
		}
		if v := h.Get(remaining); v != "" {
			h.Set("Anthropic-Ratelimit-"+unit+"-Remaining", v)
		}
		if d, err := time.ParseDuration(h.Get(reset)); err == nil {
			h.Set("Anthropic-Ratelimit-"+unit+"-Reset", now.Add(d).UTC().Format(time.RFC3339))
		}
		h.Del(limit)
		h.Del(remaining)
		h.Del(reset)
	}
}
