package schemas

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Topic names. The name carries the schema's major version; see the package
// documentation, section "Versioning", for when a v2 topic appears.
const (
	// TopicUsageV1 is the Kafka topic that carries [UsageEvent] records
	// encoded by eventjson.AppendUsageEventJSON, keyed by tenant so that one tenant's
	// events stay ordered on one partition. The contract for producers other
	// than ingest (key, [HeaderSchema], partitioner) is docs/producers.md.
	TopicUsageV1 = "sluice.usage.v1"

	// TopicSignalsV1 is the Kafka topic that carries [Signal] records encoded
	// by [EncodeSignal]. The aggregator keys them by tenant as well.
	TopicSignalsV1 = "sluice.signals.v1"
)

// Kafka record header naming the schema a record was encoded with.
const (
	// HeaderSchema is the Kafka record header key whose value names the schema
	// and major version of the record value, for example [SchemaUsageV1].
	// Consumers check it rather than trusting the topic alone, because during a
	// migration window one consumer reads both the v1 and the v2 topic.
	HeaderSchema = "schema"

	// SchemaUsageV1 is the [HeaderSchema] value of a usage event v1 record. It
	// is the same string as [TopicUsageV1]: a schema lives on the topic named
	// after it.
	SchemaUsageV1 = TopicUsageV1

	// SchemaSignalsV1 is the [HeaderSchema] value of a signal v1 record. It is
	// the same string as [TopicSignalsV1].
	SchemaSignalsV1 = TopicSignalsV1
)

// UsageEvent is usage event v1: what one finished LLM request spent. A
// gateway emits one per request; ingest validates it and produces it to
// [TopicUsageV1]; the aggregator counts it exactly once per ID.
//
// The required fields are ID, Time, Tenant, Model, PromptTokens and
// CompletionTokens. Every other field is optional and its zero value means
// "not reported". [UsageEvent.Validate] lists the rules and the package
// constants name their limits.
//
// Decode events with eventjson.DecodeUsageEvent or
// eventjson.DecodeCloudEvent and encode them with
// eventjson.AppendUsageEventJSON; the struct tags below document the JSON
// names and keep encoding/json usable for tools and tests, but the hot path
// never uses reflection.
type UsageEvent struct {
	// ID is the idempotency key: a retry of the same request, or the final
	// event that settles an Estimated one, carries the same ID, and every
	// counter in Sluice deduplicates by it. 1 to MaxIDLen bytes of printable
	// ASCII without spaces; a UUID or a ULID is a good choice.
	ID string `json:"id"`

	// Time is when the request finished, encoded in RFC 3339. Periods (the
	// hour, day and month a quota counts) are chosen by this time, not by the
	// time ingest received the event, so that late and replayed events land in
	// the right period. Decoders return it in UTC.
	Time time.Time `json:"time"`

	// Tenant is the account the tokens are charged to: 1 to MaxTenantLen bytes
	// of [A-Za-z0-9._:-]. It is the Kafka key and part of Redis key names,
	// which is why its alphabet is narrow.
	Tenant string `json:"tenant"`

	// Model is the model name as the gateway knows it, for example "gpt-4o":
	// 1 to MaxModelLen bytes of printable ASCII. Quotas select models by this
	// exact string; "*" is reserved by quota policies and signals to mean
	// "every model" and should not be sent by a gateway.
	Model string `json:"model"`

	// PromptTokens is the number of input tokens billed, cached ones
	// included: 0 to MaxTokensPerEvent.
	PromptTokens int64 `json:"prompt_tokens"`

	// CompletionTokens is the number of output tokens billed: 0 to
	// MaxTokensPerEvent.
	CompletionTokens int64 `json:"completion_tokens"`

	// User is the end user on whose behalf the request ran, if the gateway
	// knows it. At most MaxStringLen bytes.
	User string `json:"user,omitempty"`

	// APIKeyID identifies the API key the request came in with, never the key
	// itself, so that a leaked key can be traced and zeroed. At most
	// MaxStringLen bytes.
	APIKeyID string `json:"api_key_id,omitempty"`

	// Provider is the upstream that served the request, for example "openai"
	// or "azure-eastus". At most MaxStringLen bytes.
	Provider string `json:"provider,omitempty"`

	// Endpoint is the API operation, for example "/v1/chat/completions". At
	// most MaxStringLen bytes.
	Endpoint string `json:"endpoint,omitempty"`

	// CachedTokens is the part of PromptTokens read from the provider's
	// prompt cache (OpenAI's cached_tokens, Anthropic's
	// cache_read_input_tokens, Gemini's cachedContentTokenCount), which is
	// priced far below input. 0 to PromptTokens.
	CachedTokens int64 `json:"cached_tokens,omitempty"`

	// CacheWriteTokens is the part of PromptTokens written to the
	// provider's prompt cache (Anthropic's cache_creation_input_tokens),
	// which is priced above input. CachedTokens plus CacheWriteTokens is at
	// most PromptTokens: both are input tokens, so token quotas that count
	// PromptTokens count them once.
	CacheWriteTokens int64 `json:"cache_write_tokens,omitempty"`

	// ReasoningTokens is the part of CompletionTokens the model spent
	// reasoning (OpenAI's reasoning_tokens, Gemini's thoughtsTokenCount):
	// billed as output but not returned. 0 to CompletionTokens.
	ReasoningTokens int64 `json:"reasoning_tokens,omitempty"`

	// Status is the HTTP status code the gateway answered with: 0 (unknown)
	// or 100 to 599. Error-ratio breakers read it together with Outcome.
	Status int `json:"status,omitempty"`

	// Outcome classifies the request; empty means unknown.
	Outcome Outcome `json:"outcome,omitempty"`

	// LatencyMS is how long the request took end to end, in milliseconds:
	// 0 to MaxLatencyMS. Slow-call breakers read it.
	LatencyMS int64 `json:"latency_ms,omitempty"`

	// Priority is the request's priority class; empty means the tenant's
	// default.
	Priority Priority `json:"priority,omitempty"`

	// SessionID groups the requests of one agent task or conversation, so
	// that runaway agent loops can be found. At most MaxStringLen bytes.
	SessionID string `json:"session_id,omitempty"`

	// Estimated marks a pre-debit: the gateway charged an estimate before the
	// request ran so that concurrent requests cannot overrun a quota, and a
	// later event with the same ID and Estimated false settles it with the
	// real counts.
	Estimated bool `json:"estimated,omitempty"`

	// Gateway names the gateway instance or fleet that emitted the event. At
	// most MaxStringLen bytes.
	Gateway string `json:"gateway,omitempty"`

	// RequestedModel is the model the caller asked for when another one
	// served the request — a cheaper fallback the gateway chose because
	// the asked model's upstream was broken or degraded, or the tenant was
	// past a soft limit. Model is then the model that served, and every
	// counter, quota and cost counts and prices Model. Empty (the usual
	// case) means Model is the model asked for. When set, the same rules
	// as Model apply.
	RequestedModel string `json:"requested_model,omitempty"`

	// Attributes carries the gateway's own labels (team, feature, region …).
	// At most MaxAttributes entries; keys are 1 to MaxAttributeKeyLen bytes
	// of printable ASCII without spaces, values at most MaxAttributeValueLen
	// bytes. Fields that v1 does not define belong here: the decoders reject
	// unknown top-level fields rather than drop them.
	Attributes map[string]string `json:"attributes,omitempty"`
}

// TotalTokens returns PromptTokens plus CompletionTokens, the number that
// token quotas count. CachedTokens, CacheWriteTokens and ReasoningTokens
// are not added: they are already part of PromptTokens or
// CompletionTokens.
func (e *UsageEvent) TotalTokens() int64 {
	return e.PromptTokens + e.CompletionTokens
}

// Outcome classifies how a request ended, independently of the HTTP status,
// which a gateway may not have (a client that hung up) or may have rewritten.
type Outcome string

// The outcomes a usage event may carry. The empty Outcome means unknown.
const (
	// OutcomeOK is a request that completed and returned a response.
	OutcomeOK Outcome = "ok"
	// OutcomeError is a request that failed upstream or in the gateway.
	OutcomeError Outcome = "error"
	// OutcomeTimeout is a request that ran out of time; tokens may still have
	// been billed for it.
	OutcomeTimeout Outcome = "timeout"
	// OutcomeRejected is a request the gateway refused (a quota flag, a rate
	// limiter, a blacklist); it usually carries zero tokens but counts toward
	// request rates.
	OutcomeRejected Outcome = "rejected"
)

// Valid reports whether o is one of the defined outcomes. The empty Outcome
// is not valid here, but UsageEvent.Validate accepts it as "unknown".
func (o Outcome) Valid() bool {
	switch o {
	case OutcomeOK, OutcomeError, OutcomeTimeout, OutcomeRejected:
		return true
	}
	return false
}

// Priority is a request's priority class: the one type for it in usage
// events, the SDK (admission reserves, priority queues, upstream guards),
// sluice gateway, the forward-auth service and the policy. Quota policies
// may reserve capacity for higher classes and shed lower ones first. The
// empty Priority means "not set": the tenant's default.
//
// Classes are ordered by Rank (Low < Normal < High < Critical); compare
// ranks, never the strings.
type Priority string

// The priority classes, each name spelled here only.
const (
	// PriorityCritical is traffic that is shed last and served first.
	PriorityCritical Priority = "critical"
	// PriorityHigh is interactive traffic.
	PriorityHigh Priority = "high"
	// PriorityNormal is the usual class, and the default of a tenant whose
	// policy names none.
	PriorityNormal Priority = "normal"
	// PriorityLow is batch or background traffic, shed first.
	PriorityLow Priority = "low"
)

// NumPriorities is the number of classes; Priority.Index maps them onto
// 0..NumPriorities-1 for arrays indexed by class.
const NumPriorities = 4

// Priorities lists the classes, least important first (Index order).
var Priorities = [NumPriorities]Priority{PriorityLow, PriorityNormal, PriorityHigh, PriorityCritical}

// PriorityNames is "critical, high, normal, low", for messages that list
// the classes.
var PriorityNames = string(PriorityCritical) + ", " + string(PriorityHigh) + ", " + string(PriorityNormal) + ", " + string(PriorityLow)

// Valid reports whether p is one of the defined classes. The empty Priority
// is not valid here, but UsageEvent.Validate accepts it as "default".
func (p Priority) Valid() bool { return p.Rank() > 0 }

// Rank orders the classes: 1 for low up to 4 for critical, and 0 for the
// empty or an unknown Priority, so that p.Rank() >= PriorityHigh.Rank()
// reads as "high or above".
func (p Priority) Rank() int {
	switch p {
	case PriorityLow:
		return 1
	case PriorityNormal:
		return 2
	case PriorityHigh:
		return 3
	case PriorityCritical:
		return 4
	}
	return 0
}

// Index is p's position in arrays of NumPriorities (low 0 … critical 3).
// It panics on an invalid class, which would otherwise corrupt a
// neighbour's counters.
func (p Priority) Index() int {
	r := p.Rank()
	if r == 0 {
		panic(fmt.Sprintf("schemas: Index of invalid priority %q", string(p)))
	}
	return r - 1
}

// OrDefault is p, or PriorityNormal when p is empty or unknown.
func (p Priority) OrDefault() Priority {
	if p.Rank() == 0 {
		return PriorityNormal
	}
	return p
}

// ErrUnknownPriority is wrapped by every error about a priority name that
// is not one of the four.
var ErrUnknownPriority = errors.New("not one of " + PriorityNames)

// ParsePriority reads a class name, ignoring case and surrounding spaces
// (a header written "High" means high). An empty or unknown name is an
// error wrapping ErrUnknownPriority that quotes at most its first 32 bytes.
func ParsePriority(s string) (Priority, error) {
	t := strings.TrimSpace(s)
	for _, p := range Priorities {
		if strings.EqualFold(t, string(p)) {
			return p, nil
		}
	}
	if len(t) > 32 {
		t = t[:32] + "…"
	}
	return "", fmt.Errorf("priority %q: %w", t, ErrUnknownPriority)
}
