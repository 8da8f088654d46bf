package schemas

// usageField is a bit per field of UsageEvent. The decoder keeps a set of
// them to find duplicate keys and missing required fields without a map, and
// to keep validation from reporting a field a second time after decoding
// already rejected it.
type usageField uint32

const (
	fID usageField = 1 << iota
	fTime
	fTenant
	fModel
	fPromptTokens
	fCompletionTokens
	fUser
	fAPIKeyID
	fProvider
	fEndpoint
	fCachedTokens
	fStatus
	fOutcome
	fLatencyMS
	fPriority
	fSessionID
	fEstimated
	fGateway
	fAttributes
)

// requiredFields are the fields an event must carry. Validation alone cannot
// tell a missing token count from a zero one, so the decoder checks presence.
const requiredFields = fID | fTime | fTenant | fModel | fPromptTokens | fCompletionTokens

// usageFieldNames maps each field bit's position to its JSON name.
var usageFieldNames = [...]string{
	"id", "time", "tenant", "model", "prompt_tokens", "completion_tokens",
	"user", "api_key_id", "provider", "endpoint", "cached_tokens", "status",
	"outcome", "latency_ms", "priority", "session_id", "estimated", "gateway",
	"attributes",
}

// lookupUsageField returns the bit of a JSON field name, or 0 if usage event
// v1 has no such field. A switch on strings compiles to a length-then-value
// search, which beats a map lookup and allocates nothing.
func lookupUsageField(name string) usageField {
	switch name {
	case "id":
		return fID
	case "time":
		return fTime
	case "tenant":
		return fTenant
	case "model":
		return fModel
	case "prompt_tokens":
		return fPromptTokens
	case "completion_tokens":
		return fCompletionTokens
	case "user":
		return fUser
	case "api_key_id":
		return fAPIKeyID
	case "provider":
		return fProvider
	case "endpoint":
		return fEndpoint
	case "cached_tokens":
		return fCachedTokens
	case "status":
		return fStatus
	case "outcome":
		return fOutcome
	case "latency_ms":
		return fLatencyMS
	case "priority":
		return fPriority
	case "session_id":
		return fSessionID
	case "estimated":
		return fEstimated
	case "gateway":
		return fGateway
	case "attributes":
		return fAttributes
	}
	return 0
}

// name returns the JSON name of a single-bit field.
func (f usageField) name() string {
	for i := range usageFieldNames {
		if f == 1<<i {
			return usageFieldNames[i]
		}
	}
	return "?"
}
