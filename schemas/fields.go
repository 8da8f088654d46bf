package schemas

// EventField is a set of usage event v1 fields, one bit per field; a single
// bit names one field. Decoders keep such sets to find duplicate keys and
// missing required fields without a map, and hand validation the fields they
// have already reported or checked, so that each problem is reported once
// (see [UsageEvent.ValidateFields]).
type EventField uint32

// The fields of usage event v1: the order of the UsageEvent struct up to
// FieldRequestedModel, then the fields added since, oldest first.
const (
	FieldID EventField = 1 << iota
	FieldTime
	FieldTenant
	FieldModel
	FieldPromptTokens
	FieldCompletionTokens
	FieldUser
	FieldAPIKeyID
	FieldProvider
	FieldEndpoint
	FieldCachedTokens
	FieldStatus
	FieldOutcome
	FieldLatencyMS
	FieldPriority
	FieldSessionID
	FieldEstimated
	FieldGateway
	FieldAttributes
	FieldRequestedModel
	FieldCacheWriteTokens
	FieldReasoningTokens
)

// RequiredEventFields are the fields a usage event must carry. Validation
// alone cannot tell a missing token count from a zero one, so decoders check
// presence against this set.
const RequiredEventFields = FieldID | FieldTime | FieldTenant | FieldModel | FieldPromptTokens | FieldCompletionTokens

// eventFieldNames maps each field bit's position to its JSON name.
var eventFieldNames = [...]string{
	"id", "time", "tenant", "model", "prompt_tokens", "completion_tokens",
	"user", "api_key_id", "provider", "endpoint", "cached_tokens", "status",
	"outcome", "latency_ms", "priority", "session_id", "estimated", "gateway",
	"attributes", "requested_model", "cache_write_tokens", "reasoning_tokens",
}

// EventFieldNamed returns the field with JSON name name, or 0 if usage
// event v1 has no such field. Names are case-sensitive. A switch on strings
// compiles to a length-then-value search, which beats a map lookup and
// allocates nothing: decoders call it for every key.
func EventFieldNamed(name string) EventField {
	switch name {
	case "id":
		return FieldID
	case "time":
		return FieldTime
	case "tenant":
		return FieldTenant
	case "model":
		return FieldModel
	case "prompt_tokens":
		return FieldPromptTokens
	case "completion_tokens":
		return FieldCompletionTokens
	case "user":
		return FieldUser
	case "api_key_id":
		return FieldAPIKeyID
	case "provider":
		return FieldProvider
	case "endpoint":
		return FieldEndpoint
	case "cached_tokens":
		return FieldCachedTokens
	case "status":
		return FieldStatus
	case "outcome":
		return FieldOutcome
	case "latency_ms":
		return FieldLatencyMS
	case "priority":
		return FieldPriority
	case "session_id":
		return FieldSessionID
	case "estimated":
		return FieldEstimated
	case "gateway":
		return FieldGateway
	case "attributes":
		return FieldAttributes
	case "requested_model":
		return FieldRequestedModel
	case "cache_write_tokens":
		return FieldCacheWriteTokens
	case "reasoning_tokens":
		return FieldReasoningTokens
	}
	return 0
}

// Name returns the JSON name of a single-bit field, or "?" for a set of
// several or none.
func (f EventField) Name() string {
	for i := range eventFieldNames {
		if f == 1<<i {
			return eventFieldNames[i]
		}
	}
	return "?"
}
