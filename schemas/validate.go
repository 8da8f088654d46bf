package schemas

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Validate checks every rule of usage event v1 and reports every broken one
// at once as a [ValidationError]; it returns nil for a valid event. It does
// not allocate when the event is valid.
//
// The rules, with their limits:
//
//   - id: 1 to MaxIDLen bytes of printable ASCII without spaces (0x21–0x7E).
//   - time: set, and between 1970-01-01T00:00:00Z and 2105-12-31T23:59:59Z
//     (MaxEventTimeText; ClickHouse's DateTime ends in February 2106).
//     Whether it is too far in the past or the future depends on the
//     deployment, so ingest checks that separately with [CheckTime].
//   - tenant: 1 to MaxTenantLen bytes of [A-Za-z0-9._:-].
//   - model: 1 to MaxModelLen bytes of printable ASCII (0x20–0x7E), not
//     the reserved name "*" and not beginning with "@" (see [CheckEventModel]).
//   - prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens,
//     reasoning_tokens: 0 to MaxTokensPerEvent; cached_tokens +
//     cache_write_tokens at most prompt_tokens, reasoning_tokens at most
//     completion_tokens.
//   - status: 0 (unknown) or MinStatus to MaxStatus.
//   - outcome, priority: empty or one of the defined constants.
//   - latency_ms: 0 to MaxLatencyMS.
//   - user, api_key_id, provider, endpoint, session_id, gateway: valid
//     UTF-8, at most MaxStringLen bytes.
//   - requested_model: empty, or as model.
//   - attributes: at most MaxAttributes entries; keys 1 to
//     MaxAttributeKeyLen bytes of printable ASCII without spaces; values
//     valid UTF-8 of at most MaxAttributeValueLen bytes.
func (e *UsageEvent) Validate() error {
	var errs ValidationError
	e.ValidateFields(&errs, "", 0)
	return errs.Err()
}

// ValidateFields is Validate for decoders: it appends the problems of e to
// errs, naming fields with prefix ("data." inside a CloudEvent), and leaves
// out the fields in skip. A decoder puts in skip the fields it has already
// reported (a wrong type, a duplicate key), so that a problem is not
// reported twice, and the fields it checked against every rule while it
// read them, so that valid input is not checked twice.
func (e *UsageEvent) ValidateFields(errs *ValidationError, prefix string, skip EventField) {
	if skip&FieldID == 0 {
		if r := CheckID(e.ID); r != "" {
			errs.Add(prefix, "id", r)
		}
	}
	if skip&FieldTime == 0 {
		if r := CheckEventTime(e.Time); r != "" {
			errs.Add(prefix, "time", r)
		}
	}
	if skip&FieldTenant == 0 {
		if r := checkTenant(e.Tenant); r != "" {
			errs.Add(prefix, "tenant", r)
		}
	}
	if skip&FieldModel == 0 {
		if r := CheckEventModel(e.Model); r != "" {
			errs.Add(prefix, "model", r)
		}
	}
	if skip&FieldPromptTokens == 0 {
		if r := checkTokens(e.PromptTokens); r != "" {
			errs.Add(prefix, "prompt_tokens", r)
		}
	}
	if skip&FieldCompletionTokens == 0 {
		if r := checkTokens(e.CompletionTokens); r != "" {
			errs.Add(prefix, "completion_tokens", r)
		}
	}
	if skip&FieldCachedTokens == 0 {
		if r := checkTokens(e.CachedTokens); r != "" {
			errs.Add(prefix, "cached_tokens", r)
		} else if e.CachedTokens > e.PromptTokens && skip&FieldPromptTokens == 0 && e.PromptTokens >= 0 {
			errs.Add(prefix, "cached_tokens", fmt.Sprintf(
				"is %d but prompt_tokens is %d; cached tokens are part of prompt_tokens, so cached_tokens must not exceed it",
				e.CachedTokens, e.PromptTokens))
		}
	}
	if skip&FieldCacheWriteTokens == 0 {
		if r := checkTokens(e.CacheWriteTokens); r != "" {
			errs.Add(prefix, "cache_write_tokens", r)
		} else if skip&(FieldPromptTokens|FieldCachedTokens) == 0 && e.PromptTokens >= 0 && e.CachedTokens >= 0 &&
			e.CachedTokens <= e.PromptTokens && e.CacheWriteTokens > e.PromptTokens-e.CachedTokens {
			errs.Add(prefix, "cache_write_tokens", fmt.Sprintf(
				"is %d but prompt_tokens is %d and cached_tokens %d; cache reads and writes are both part of prompt_tokens, so cached_tokens + cache_write_tokens must not exceed it",
				e.CacheWriteTokens, e.PromptTokens, e.CachedTokens))
		}
	}
	if skip&FieldReasoningTokens == 0 {
		if r := checkTokens(e.ReasoningTokens); r != "" {
			errs.Add(prefix, "reasoning_tokens", r)
		} else if e.ReasoningTokens > e.CompletionTokens && skip&FieldCompletionTokens == 0 && e.CompletionTokens >= 0 {
			errs.Add(prefix, "reasoning_tokens", fmt.Sprintf(
				"is %d but completion_tokens is %d; reasoning tokens are part of completion_tokens, so reasoning_tokens must not exceed it",
				e.ReasoningTokens, e.CompletionTokens))
		}
	}
	if skip&FieldStatus == 0 && e.Status != 0 && (e.Status < MinStatus || e.Status > MaxStatus) {
		errs.Add(prefix, "status", fmt.Sprintf(
			"is %d; send 0 when unknown or an HTTP status code from %d to %d (MinStatus..MaxStatus)",
			e.Status, MinStatus, MaxStatus))
	}
	if skip&FieldOutcome == 0 && e.Outcome != "" && !e.Outcome.Valid() {
		errs.Add(prefix, "outcome", fmt.Sprintf(
			"is %q; use one of ok, error, timeout, rejected, or leave it out", string(e.Outcome)))
	}
	if skip&FieldLatencyMS == 0 && (e.LatencyMS < 0 || e.LatencyMS > MaxLatencyMS) {
		errs.Add(prefix, "latency_ms", fmt.Sprintf(
			"is %d; send milliseconds from 0 to %d (MaxLatencyMS, one hour)", e.LatencyMS, MaxLatencyMS))
	}
	if skip&FieldPriority == 0 && e.Priority != "" && !e.Priority.Valid() {
		errs.Add(prefix, "priority", fmt.Sprintf(
			"is %q; use one of %s, or leave it out", string(e.Priority), PriorityNames))
	}
	checkOptional(errs, prefix, "user", e.User, skip&FieldUser != 0)
	checkOptional(errs, prefix, "api_key_id", e.APIKeyID, skip&FieldAPIKeyID != 0)
	checkOptional(errs, prefix, "provider", e.Provider, skip&FieldProvider != 0)
	checkOptional(errs, prefix, "endpoint", e.Endpoint, skip&FieldEndpoint != 0)
	checkOptional(errs, prefix, "session_id", e.SessionID, skip&FieldSessionID != 0)
	checkOptional(errs, prefix, "gateway", e.Gateway, skip&FieldGateway != 0)
	if skip&FieldRequestedModel == 0 && e.RequestedModel != "" {
		if r := CheckEventModel(e.RequestedModel); r != "" {
			errs.Add(prefix, "requested_model", r)
		}
	}
	if skip&FieldAttributes == 0 {
		checkAttributes(errs, prefix, e.Attributes)
	}
}

// CheckTime reports whether t lies within the window ingest accepts around
// now: no more than maxPast before it and no more than maxFuture after it. A
// bound of zero or less disables that side. It returns nil when t is inside,
// and otherwise a FieldError for "time" saying by how much t missed.
//
// The window is not part of [UsageEvent.Validate] because it depends on the
// deployment (how long gateways buffer while Sluice is down, how late a
// period may still be corrected) and on the clock of the process checking.
func CheckTime(t, now time.Time, maxPast, maxFuture time.Duration) *FieldError {
	if maxFuture > 0 && t.After(now.Add(maxFuture)) {
		return &FieldError{Field: "time", Reason: fmt.Sprintf(
			"%s is %s in the future; at most %s is accepted: check the gateway's clock",
			t.UTC().Format(time.RFC3339Nano), t.Sub(now).Round(time.Millisecond), maxFuture)}
	}
	if maxPast > 0 && t.Before(now.Add(-maxPast)) {
		return &FieldError{Field: "time", Reason: fmt.Sprintf(
			"%s is %s in the past; at most %s is accepted: the period it belongs to is closed, report it through reconciliation",
			t.UTC().Format(time.RFC3339Nano), now.Sub(t).Round(time.Millisecond), maxPast)}
	}
	return nil
}

// Byte classes of the identifier-like fields, as lookup tables: a table
// lookup per byte is what keeps validation in the nanoseconds.
var (
	// printableNoSpace is 0x21–0x7E: ids and attribute keys.
	printableNoSpace = byteClass(func(c byte) bool { return c > ' ' && c < 0x7f })
	// printable is 0x20–0x7E: model names.
	printable = byteClass(func(c byte) bool { return c >= ' ' && c < 0x7f })
	// tenantChars is [A-Za-z0-9._:-]: tenants end up in Redis keys and
	// ClickHouse identifiers where anything else needs escaping.
	tenantChars = byteClass(func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
	})
)

// byteClass returns the table of the bytes for which in is true.
func byteClass(in func(byte) bool) *[256]bool {
	var t [256]bool
	for i := range t {
		t[i] = in(byte(i))
	}
	return &t
}

// checkIdent checks a required identifier-like string and returns the reason
// it is invalid, or "".
func checkIdent(s string, maxLen int, limitName string, class *[256]bool, classDesc string) string {
	if s == "" {
		return fmt.Sprintf("is required; send 1 to %d bytes of %s", maxLen, classDesc)
	}
	if len(s) > maxLen {
		return fmt.Sprintf("is %d bytes long; the maximum is %d bytes (%s)", len(s), maxLen, limitName)
	}
	if i := firstNotIn(s, class); i >= 0 {
		return fmt.Sprintf("has byte 0x%02X at offset %d; use only %s", s[i], i, classDesc)
	}
	return ""
}

// firstNotIn returns the offset of the first byte of s outside class, or -1.
func firstNotIn(s string, class *[256]bool) int {
	for i := 0; i < len(s); i++ {
		if !class[s[i]] {
			return i
		}
	}
	return -1
}

// CheckID checks an event or signal ID, or a CloudEvents id, and returns
// the reason it is invalid, or "".
func CheckID(s string) string {
	return checkIdent(s, MaxIDLen, "MaxIDLen", printableNoSpace, "printable ASCII without spaces (0x21-0x7E)")
}

// CheckTenant checks a tenant name (as readers such as the usage API take
// it from a request) and returns the reason it is invalid, or "".
func CheckTenant(s string) string { return checkTenant(s) }

// checkTenant checks a tenant name and returns the reason it is invalid, or
// "".
func checkTenant(s string) string {
	return checkIdent(s, MaxTenantLen, "MaxTenantLen", tenantChars, "letters, digits and . _ : -")
}

// checkModel checks a model name and returns the reason it is invalid, or
// "".
func checkModel(s string) string {
	return checkIdent(s, MaxModelLen, "MaxModelLen", printable, "printable ASCII (0x20-0x7E)")
}

// CheckEventModel checks the model of a usage event and returns the reason
// it is invalid, or "". Beyond [checkModel] it refuses the names Sluice
// reserves: "*" means "every model" in policies, signals and flags, so an
// event for model "*" would be accepted and then dropped by the aggregator
// (tokens spent and never metered); names beginning with "@" are the
// non-model fields of the Redis flag hash ("@v", "@key:…"), so a flag for
// such a model would overwrite them.
func CheckEventModel(s string) string {
	if r := checkModel(s); r != "" {
		return r
	}
	if s == "*" {
		return `is "*", which is reserved for "every model" in policies and flags; send the name of the model the request used`
	}
	if s[0] == '@' {
		return fmt.Sprintf("is %q; model names beginning with \"@\" are reserved by the flag layout: send the model name without the leading @", s)
	}
	return ""
}

// CheckEventTime checks that the time of an event or signal is set and
// within the years Sluice can store (1970 to 2105), and returns the reason it is not, or
// "". Decoders that take a time from elsewhere (a CloudEvents envelope) call
// it themselves.
func CheckEventTime(t time.Time) string {
	if t.IsZero() {
		return "is required; send the time the request finished in RFC 3339, for example 2024-05-01T12:00:00Z"
	}
	if t.Before(minEventTime) || t.After(maxEventTime) {
		return fmt.Sprintf("is %s, outside 1970-01-01T00:00:00Z to %s (MaxEventTimeText, where ClickHouse's DateTime ends); check the gateway's clock",
			t.UTC().Format(time.RFC3339Nano), MaxEventTimeText)
	}
	return ""
}

// checkTokens checks a token count and returns the reason it is invalid, or
// "".
func checkTokens(n int64) string {
	if n < 0 {
		return fmt.Sprintf("is %d; token counts cannot be negative", n)
	}
	if n > MaxTokensPerEvent {
		return fmt.Sprintf("is %d; the maximum is %d (MaxTokensPerEvent): send the tokens of one request, not a running total",
			n, MaxTokensPerEvent)
	}
	return ""
}

// checkOptional checks one of the optional free-form strings.
func checkOptional(errs *ValidationError, prefix, field, s string, skip bool) {
	if skip || s == "" {
		return
	}
	if len(s) > MaxStringLen {
		errs.Add(prefix, field, fmt.Sprintf("is %d bytes long; the maximum is %d bytes (MaxStringLen)", len(s), MaxStringLen))
	} else if !utf8.ValidString(s) {
		errs.Add(prefix, field, "is not valid UTF-8; send text encoded in UTF-8")
	}
}

// checkAttributes checks the attributes map as a whole and entry by entry.
func checkAttributes(errs *ValidationError, prefix string, attrs map[string]string) {
	if len(attrs) == 0 {
		return
	}
	start := len(*errs)
	if len(attrs) > MaxAttributes {
		errs.Add(prefix, "attributes", fmt.Sprintf(
			"has %d entries; the maximum is %d (MaxAttributes): keep attributes to a few labels", len(attrs), MaxAttributes))
	}
	for k, v := range attrs {
		if r := checkAttributeKey(k); r != "" {
			if k == "" {
				errs.Add(prefix, "attributes", r)
			} else {
				errs.Add(prefix, "attributes."+FieldPath(k), r)
			}
		}
		if len(v) > MaxAttributeValueLen {
			errs.Add(prefix, "attributes."+FieldPath(k), fmt.Sprintf(
				"value is %d bytes long; the maximum is %d bytes (MaxAttributeValueLen)", len(v), MaxAttributeValueLen))
		} else if !utf8.ValidString(v) {
			errs.Add(prefix, "attributes."+FieldPath(k), "value is not valid UTF-8; send text encoded in UTF-8")
		}
	}
	// Map order is random; sorted problems make responses and tests stable.
	slices.SortStableFunc((*errs)[start:], func(a, b FieldError) int { return strings.Compare(a.Field, b.Field) })
}

// AttributeValid reports whether one attribute entry passes every rule that
// validation applies to an entry on its own; the number of entries is
// checked separately. A decoder calls it while the entry's bytes are at
// hand, and skips FieldAttributes in [UsageEvent.ValidateFields] when every
// entry passed, so that valid attributes are walked once.
func AttributeValid(key, val string) bool {
	return checkAttributeKey(key) == "" && len(val) <= MaxAttributeValueLen && utf8.ValidString(val)
}

// checkAttributeKey checks an attribute key and returns the reason it is
// invalid, or "".
func checkAttributeKey(k string) string {
	switch {
	case k == "":
		return fmt.Sprintf("has an empty key; keys are 1 to %d bytes of printable ASCII without spaces", MaxAttributeKeyLen)
	case len(k) > MaxAttributeKeyLen:
		return fmt.Sprintf("key is %d bytes long; the maximum is %d bytes (MaxAttributeKeyLen)", len(k), MaxAttributeKeyLen)
	}
	if i := firstNotIn(k, printableNoSpace); i >= 0 {
		return fmt.Sprintf("key has byte 0x%02X at offset %d; use only printable ASCII without spaces (0x21-0x7E)", k[i], i)
	}
	return ""
}
