package eventjson

import (
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/schemas"
)

// AppendUsageEventJSON appends the canonical JSON encoding of ev to dst and
// returns the extended slice. Canonical means: fields in the order of the
// schemas.UsageEvent struct, optional fields left out when zero, attributes
// sorted by key, time in UTC with RFC 3339 and only the fractional digits
// needed, no insignificant whitespace. Equal events therefore encode to equal
// bytes, which keeps Kafka compaction and byte-level dedup honest.
//
// It does not validate ev: call [schemas.UsageEvent.Validate] first. A valid
// event encodes to JSON that [DecodeUsageEvent] turns back into an equal
// event. Invalid UTF-8 in strings is written as U+FFFD, as encoding/json
// does. Appending to a reused buffer allocates nothing unless the event has
// more than schemas.MaxAttributes attributes.
func AppendUsageEventJSON(dst []byte, ev *schemas.UsageEvent) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, ev.ID)
	dst = append(dst, `,"time":"`...)
	dst = ev.Time.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","tenant":`...)
	dst = appendString(dst, ev.Tenant)
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, ev.Model)
	dst = append(dst, `,"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, ev.PromptTokens, 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, ev.CompletionTokens, 10)
	dst = appendOptString(dst, `,"user":`, ev.User)
	dst = appendOptString(dst, `,"api_key_id":`, ev.APIKeyID)
	dst = appendOptString(dst, `,"provider":`, ev.Provider)
	dst = appendOptString(dst, `,"endpoint":`, ev.Endpoint)
	dst = appendOptInt(dst, `,"cached_tokens":`, ev.CachedTokens)
	dst = appendOptInt(dst, `,"cache_write_tokens":`, ev.CacheWriteTokens)
	dst = appendOptInt(dst, `,"reasoning_tokens":`, ev.ReasoningTokens)
	dst = appendOptInt(dst, `,"status":`, int64(ev.Status))
	dst = appendOptString(dst, `,"outcome":`, string(ev.Outcome))
	dst = appendOptInt(dst, `,"latency_ms":`, ev.LatencyMS)
	dst = appendOptString(dst, `,"priority":`, string(ev.Priority))
	dst = appendOptString(dst, `,"session_id":`, ev.SessionID)
	if ev.Estimated {
		dst = append(dst, `,"estimated":true`...)
	}
	dst = appendOptString(dst, `,"gateway":`, ev.Gateway)
	dst = appendOptString(dst, `,"requested_model":`, ev.RequestedModel)
	if len(ev.Attributes) > 0 {
		dst = append(dst, `,"attributes":{`...)
		dst = appendAttributes(dst, ev.Attributes)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

func appendOptString(dst []byte, key, s string) []byte {
	if s == "" {
		return dst
	}
	return appendString(append(dst, key...), s)
}

func appendOptInt(dst []byte, key string, v int64) []byte {
	if v == 0 {
		return dst
	}
	return strconv.AppendInt(append(dst, key...), v, 10)
}

// appendAttributes writes the entries sorted by key. The keys are sorted in
// an array on the stack, which holds every valid event's attributes.
func appendAttributes(dst []byte, attrs map[string]string) []byte {
	var buf [schemas.MaxAttributes]string
	keys := buf[:0]
	for k := range attrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, k)
		dst = append(dst, ':')
		dst = appendString(dst, attrs[k])
	}
	return dst
}

// strSafe marks the bytes that go into a JSON string as they are. HTML
// characters are not escaped: the output is for machines, not for pages.
var strSafe = func() (t [256]bool) {
	for i := 0x20; i < 0x80; i++ {
		t[i] = true
	}
	t['"'] = false
	t['\\'] = false
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if strSafe[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
