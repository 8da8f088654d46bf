package schemas

import "time"

// Limits of usage event v1. The JSON Schemas in [JSONSchemaFS] state the same
// numbers; a test keeps the two in agreement. Raising a limit is an additive
// change (old events stay valid); lowering one is a breaking change that
// needs a new schema version.
const (
	// MaxIDLen is the maximum length of UsageEvent.ID and Signal.ID in bytes.
	// 128 holds any UUID, ULID or hash with room for a prefix, and keeps the
	// dedup index small.
	MaxIDLen = 128

	// MaxTenantLen is the maximum length of a tenant name in bytes. Tenants
	// appear in Kafka keys, ClickHouse sort keys and Redis key names.
	MaxTenantLen = 64

	// MaxModelLen is the maximum length of a model name in bytes.
	MaxModelLen = 128

	// MaxTokensPerEvent bounds each token count of one event (PromptTokens,
	// CompletionTokens, CachedTokens, CacheWriteTokens, ReasoningTokens). No single request comes near a billion
	// tokens, so a larger value is a bug (a counter sent instead of a delta, a
	// unit mix-up) and is refused before it can exhaust a quota.
	MaxTokensPerEvent = 1_000_000_000

	// MinStatus and MaxStatus bound UsageEvent.Status when it is not 0:
	// the range of HTTP status codes.
	MinStatus = 100
	// MaxStatus is the highest accepted HTTP status code; see MinStatus.
	MaxStatus = 599

	// MaxLatencyMS bounds UsageEvent.LatencyMS: one hour. A longer latency is
	// a unit mix-up (microseconds sent as milliseconds) more often than a real
	// request, and it would poison slow-call ratios.
	MaxLatencyMS = 3_600_000

	// MaxStringLen is the maximum length in bytes of the optional free-form
	// strings: User, APIKeyID, Provider, Endpoint, SessionID and Gateway.
	MaxStringLen = 256

	// MaxAttributes is the maximum number of entries in Attributes.
	// Attributes are labels, stored with every event; bulk data does not
	// belong in them.
	MaxAttributes = 32

	// MaxAttributeKeyLen is the maximum length of an attribute key in bytes.
	MaxAttributeKeyLen = 64

	// MaxAttributeValueLen is the maximum length of an attribute value in
	// bytes.
	MaxAttributeValueLen = 256

	// MaxTier is the highest alert tier a Signal may carry, in percent of the
	// limit. Tiers above 100 exist (a soft quota keeps counting past its
	// limit) but a tier beyond ten times the limit is a bug.
	MaxTier = 1000

	// MaxReasonLen is the maximum length of Signal.Reason in bytes.
	MaxReasonLen = 1024

	// MaxProblemsPerEvent is the most problems a ValidationError lists for
	// one event; past it one last entry says that more were left out. An
	// event with 700,000 bad attribute keys would otherwise produce an
	// error (and an HTTP answer) far larger than itself; the first few
	// problems are enough to fix the sender.
	MaxProblemsPerEvent = 20

	// MaxNesting is how deeply the decoders follow nested arrays and objects
	// (inside fields they are going to reject or, in a signal, skip) before
	// they give up with a SyntaxError; it bounds the work and stack a hostile
	// input can cause. It applies to DecodeSignal too, whose walker used to
	// be encoding/json's (bound 10,000).
	MaxNesting = 512
)

// Event times must fall between these instants. Go's zero time.Time (year 1)
// means "not set"; anything before 1970 is a broken clock or a unit mix-up.
// The upper end is where the events are stored: ClickHouse's DateTime is
// seconds in a UInt32 and ends at 2106-02-07T06:28:15Z, and the driver
// silently wraps a later time into the 1970s instead of failing. The cap is
// the last second of 2105, a whole year that both the Go check and the JSON
// Schema's year pattern can state.
var (
	minEventTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxEventTime = time.Date(2105, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

// MaxEventTimeText is the latest event time accepted, as written in errors
// and in the JSON Schema.
const MaxEventTimeText = "2105-12-31T23:59:59Z"
