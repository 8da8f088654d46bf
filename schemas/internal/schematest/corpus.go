package schematest

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/schemas"
)

// Case is a document with the verdict both a Go decoder and the JSON Schema
// must reach. GoOnly names a rule JSON Schema cannot express: the Go
// decoder rejects the document and the schema accepts it, and the agreement
// tests check exactly that, so the list of known differences stays true.
type Case struct {
	Name   string
	Doc    string
	Valid  bool
	GoOnly string
}

// object writes a JSON object of the members in base, each replaced by the
// override of the same name or left out when that override is "-", then the
// overrides that name no member of base, then tail if it is not empty.
// Overrides are name, value pairs; values are JSON text.
func object(base [][2]string, overrides []string, tail string) string {
	members := append([][2]string(nil), base...)
	for i := 0; i+1 < len(overrides); i += 2 {
		k, v := overrides[i], overrides[i+1]
		found := false
		for j := range base {
			if members[j][0] == k {
				members[j][1], found = v, true
			}
		}
		if !found {
			members = append(members, [2]string{k, v})
		}
	}
	var parts []string
	for _, m := range members {
		if m[1] != "-" {
			parts = append(parts, `"`+m[0]+`":`+m[1])
		}
	}
	if tail != "" {
		parts = append(parts, tail)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Ev builds a usage event document from the required fields with some of
// them replaced or removed (value "-") and extra members appended.
func Ev(overrides ...string) string {
	return object([][2]string{
		{"id", `"evt-1"`}, {"time", `"2024-05-01T12:00:00Z"`}, {"tenant", `"acme"`},
		{"model", `"gpt-4o"`}, {"prompt_tokens", "1200"}, {"completion_tokens", "350"},
	}, overrides, "")
}

// Attrs builds an attributes object of n entries with keys of keyLen bytes
// and values of valLen bytes.
func Attrs(n, keyLen, valLen int) string {
	var parts []string
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		k += strings.Repeat("x", max(0, keyLen-len(k)))
		parts = append(parts, fmt.Sprintf(`"%s":"%s"`, k, strings.Repeat("v", valLen)))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Q quotes s as a JSON string; s must need no escaping.
func Q(s string) string { return `"` + s + `"` }

// UsageCorpus is the corpus of usage event documents.
var UsageCorpus = []Case{
	// Accepted.
	{Name: "minimal", Doc: Ev(), Valid: true},
	{Name: "typical", Doc: Ev("api_key_id", Q("key_1"), "status", "200", "outcome", Q("ok"), "latency_ms", "1840"), Valid: true},
	{Name: "all optional", Doc: Ev("user", Q("u"), "api_key_id", Q("k"), "provider", Q("openai"), "endpoint", Q("/v1/chat"),
		"cached_tokens", "1200", "status", "429", "outcome", Q("rejected"), "latency_ms", "3", "priority", Q("critical"),
		"session_id", Q("s"), "estimated", "true", "gateway", Q("gw"), "attributes", `{"team":"search"}`), Valid: true},
	{Name: "optional nulls", Doc: Ev("user", "null", "cached_tokens", "null", "status", "null", "outcome", "null",
		"priority", "null", "estimated", "null", "attributes", "null", "latency_ms", "null"), Valid: true},
	{Name: "empty enums and strings", Doc: Ev("outcome", `""`, "priority", `""`, "user", `""`, "gateway", `""`), Valid: true},
	{Name: "status zero", Doc: Ev("status", "0"), Valid: true},
	{Name: "status bounds", Doc: Ev("status", "100", "latency_ms", "3600000"), Valid: true},
	{Name: "status 599", Doc: Ev("status", "599", "latency_ms", "0"), Valid: true},
	{Name: "max tokens", Doc: Ev("prompt_tokens", "1000000000", "completion_tokens", "1000000000", "cached_tokens", "1000000000"), Valid: true},
	{Name: "zero tokens", Doc: Ev("prompt_tokens", "0", "completion_tokens", "0"), Valid: true},
	{Name: "whole fraction", Doc: Ev("prompt_tokens", "12.0", "completion_tokens", "1.5e1"), Valid: true},
	{Name: "exponent", Doc: Ev("prompt_tokens", "1e3", "completion_tokens", "250E-1", "status", "2e2"), Valid: true},
	{Name: "negative zero", Doc: Ev("prompt_tokens", "-0"), Valid: true},
	{Name: "time offset", Doc: Ev("time", Q("2024-05-01T17:30:00+05:30")), Valid: true},
	{Name: "time negative offset", Doc: Ev("time", Q("2024-05-01T07:00:00.5-05:00")), Valid: true},
	{Name: "time nanoseconds", Doc: Ev("time", Q("2024-05-01T12:00:00.123456789Z")), Valid: true},
	{Name: "time leap day", Doc: Ev("time", Q("2024-02-29T23:59:59Z")), Valid: true},
	{Name: "time epoch", Doc: Ev("time", Q("1970-01-01T00:00:00Z")), Valid: true},
	{Name: "32 attributes", Doc: Ev("attributes", Attrs(32, 64, 256)), Valid: true},
	{Name: "empty attributes", Doc: Ev("attributes", "{}"), Valid: true},
	{Name: "long id", Doc: Ev("id", Q(strings.Repeat("x", 128))), Valid: true},
	{Name: "printable id", Doc: Ev("id", Q(`!#$%&'()*+,-./09:;<=>?@AZ[]^_`+"`"+`az{|}~`)), Valid: true},
	{Name: "long tenant", Doc: Ev("tenant", Q(strings.Repeat("t", 60)+"._:-")), Valid: true},
	{Name: "model with space", Doc: Ev("model", Q("Llama 3 70B Instruct")), Valid: true},
	{Name: "long model", Doc: Ev("model", Q(strings.Repeat("m", 128))), Valid: true},
	{Name: "escapes", Doc: Ev("model", Q(`gpt\u002d4o`), "user", Q(`a\"b\\c\/\n\t\u00e9\ud83d\ude00`)), Valid: true},
	{Name: "escaped key", Doc: Ev("\\u0075ser", Q("x")), Valid: true},
	{Name: "unicode user", Doc: Ev("user", Q("Jürgen 山田")), Valid: true},
	{Name: "long user", Doc: Ev("user", Q(strings.Repeat("u", 256)), "session_id", Q(strings.Repeat("s", 256))), Valid: true},
	{Name: "whitespace", Doc: " \n" + strings.ReplaceAll(Ev(), ",", " ,\n\t") + "\r\n", Valid: true},

	// Rejected by both.
	{Name: "missing id", Doc: Ev("id", "-")},
	{Name: "missing time", Doc: Ev("time", "-")},
	{Name: "missing tenant", Doc: Ev("tenant", "-")},
	{Name: "missing model", Doc: Ev("model", "-")},
	{Name: "missing prompt_tokens", Doc: Ev("prompt_tokens", "-")},
	{Name: "missing completion_tokens", Doc: Ev("completion_tokens", "-")},
	{Name: "unknown field", Doc: Ev("color", Q("blue"))},
	{Name: "unknown field null", Doc: Ev("color", "null")},
	{Name: "string for integer", Doc: Ev("prompt_tokens", Q("12"))},
	{Name: "bool for integer", Doc: Ev("status", "true")},
	{Name: "integer for string", Doc: Ev("tenant", "5")},
	{Name: "string for bool", Doc: Ev("estimated", Q("true"))},
	{Name: "array for attributes", Doc: Ev("attributes", `["a"]`)},
	{Name: "number attribute value", Doc: Ev("attributes", `{"a":1}`)},
	{Name: "null attribute value", Doc: Ev("attributes", `{"a":null}`)},
	{Name: "required null", Doc: Ev("tenant", "null")},
	{Name: "required tokens null", Doc: Ev("completion_tokens", "null")},
	{Name: "negative tokens", Doc: Ev("prompt_tokens", "-1")},
	{Name: "negative cached", Doc: Ev("cached_tokens", "-1")},
	{Name: "tokens over limit", Doc: Ev("completion_tokens", "1000000001")},
	{Name: "tokens overflow", Doc: Ev("prompt_tokens", "99999999999999999999")},
	{Name: "fraction", Doc: Ev("prompt_tokens", "1.5")},
	{Name: "tiny fraction", Doc: Ev("latency_ms", "5.000000000000000001")},
	{Name: "status 99", Doc: Ev("status", "99")},
	{Name: "status 600", Doc: Ev("status", "600")},
	{Name: "status negative", Doc: Ev("status", "-200")},
	{Name: "outcome unknown", Doc: Ev("outcome", Q("success"))},
	{Name: "outcome case", Doc: Ev("outcome", Q("OK"))},
	{Name: "priority unknown", Doc: Ev("priority", Q("urgent"))},
	{Name: "latency over limit", Doc: Ev("latency_ms", "3600001")},
	{Name: "latency negative", Doc: Ev("latency_ms", "-1")},
	{Name: "user too long", Doc: Ev("user", Q(strings.Repeat("u", 257)))},
	{Name: "gateway too long", Doc: Ev("gateway", Q(strings.Repeat("g", 300)))},
	{Name: "token types (cache read, cache write, reasoning)", Doc: Ev("cached_tokens", "700", "cache_write_tokens", "500",
		"reasoning_tokens", "350"), Valid: true},
	{Name: "token types null", Doc: Ev("cache_write_tokens", "null", "reasoning_tokens", "null"), Valid: true},
	{Name: "negative cache write", Doc: Ev("cache_write_tokens", "-1")},
	{Name: "reasoning too many", Doc: Ev("reasoning_tokens", "1000000001", "completion_tokens", "1000000000")},
	{Name: "reasoning not an integer", Doc: Ev("reasoning_tokens", "1.5")},
	{Name: "cache write a string", Doc: Ev("cache_write_tokens", Q("5"))},
	{Name: "requested model (a fallback served)", Doc: Ev("requested_model", Q("gpt-4o")), Valid: true},
	{Name: "requested model empty or null", Doc: Ev("requested_model", `""`, "user", "null"), Valid: true},
	{Name: "requested model null", Doc: Ev("requested_model", "null"), Valid: true},
	{Name: "requested model reserved", Doc: Ev("requested_model", Q("*"))},
	{Name: "requested model too long", Doc: Ev("requested_model", Q(strings.Repeat("m", 129)))},
	{Name: "requested model not a string", Doc: Ev("requested_model", "7")},
	{Name: "33 attributes", Doc: Ev("attributes", Attrs(33, 2, 1))},
	{Name: "attribute key space", Doc: Ev("attributes", `{"a b":"x"}`)},
	{Name: "attribute key empty", Doc: Ev("attributes", `{"":"x"}`)},
	{Name: "attribute key too long", Doc: Ev("attributes", Attrs(1, 65, 1))},
	{Name: "attribute value too long", Doc: Ev("attributes", Attrs(1, 3, 257))},
	{Name: "id empty", Doc: Ev("id", `""`)},
	{Name: "id space", Doc: Ev("id", Q("a b"))},
	{Name: "id too long", Doc: Ev("id", Q(strings.Repeat("x", 129)))},
	{Name: "id unicode", Doc: Ev("id", Q("é"))},
	{Name: "tenant slash", Doc: Ev("tenant", Q("acme/prod"))},
	{Name: "tenant too long", Doc: Ev("tenant", Q(strings.Repeat("t", 65)))},
	{Name: "tenant empty", Doc: Ev("tenant", `""`)},
	{Name: "model newline", Doc: Ev("model", Q(`gpt\n4`))},
	{Name: "model too long", Doc: Ev("model", Q(strings.Repeat("m", 129)))},
	{Name: "model tab", Doc: Ev("model", Q(`a\tb`))},
	{Name: "model reserved star", Doc: Ev("model", Q("*"))},
	{Name: "model reserved at", Doc: Ev("model", Q("@v"))},
	{Name: "model reserved at key", Doc: Ev("model", Q("@key:k1"))},
	{Name: "model star prefix", Doc: Ev("model", Q("*x")), Valid: true},
	{Name: "model at inside", Doc: Ev("model", Q("gpt@4")), Valid: true},
	{Name: "model one char", Doc: Ev("model", Q("m")), Valid: true},
	{Name: "time date only", Doc: Ev("time", Q("2024-05-01"))},
	{Name: "time space", Doc: Ev("time", Q("2024-05-01 12:00:00Z"))},
	{Name: "time lower case", Doc: Ev("time", Q("2024-05-01t12:00:00z"))},
	{Name: "time no zone", Doc: Ev("time", Q("2024-05-01T12:00:00"))},
	{Name: "time hour 24", Doc: Ev("time", Q("2024-05-01T24:00:00Z"))},
	{Name: "time leap second", Doc: Ev("time", Q("2016-12-31T23:59:60Z"))},
	{Name: "time feb 30", Doc: Ev("time", Q("2024-02-30T12:00:00Z"))},
	{Name: "time 1969", Doc: Ev("time", Q("1969-12-31T23:59:59Z"))},
	{Name: "time 2106", Doc: Ev("time", Q("2106-01-01T00:00:00Z"))},
	{Name: "time 2200", Doc: Ev("time", Q("2200-05-01T12:00:00Z"))},
	{Name: "time 9999", Doc: Ev("time", Q("9999-12-31T23:59:59Z"))},
	{Name: "time last second of 2105", Doc: Ev("time", Q("2105-12-31T23:59:59.999999999Z")), Valid: true},
	{Name: "time ten fraction digits", Doc: Ev("time", Q("2024-05-01T12:00:00.1234567891Z"))},
	{Name: "time comma", Doc: Ev("time", Q("2024-05-01T12:00:00,5Z"))},
	{Name: "time unix", Doc: Ev("time", "1714564800")},
	{Name: "time offset without colon", Doc: Ev("time", Q("2024-05-01T12:00:00+0200"))},
	{Name: "not an object", Doc: `[` + Ev() + `]`},
	{Name: "string document", Doc: `"event"`},

	// Rejected by Go only: rules JSON Schema cannot express.
	{Name: "cached above prompt", Doc: Ev("cached_tokens", "1201"), GoOnly: "comparison between two fields"},
	{Name: "cache read and write above prompt", Doc: Ev("cached_tokens", "700", "cache_write_tokens", "501"), GoOnly: "comparison between two fields"},
	{Name: "cache write above prompt", Doc: Ev("cache_write_tokens", "1201"), GoOnly: "comparison between two fields"},
	{Name: "reasoning above completion", Doc: Ev("reasoning_tokens", "351"), GoOnly: "comparison between two fields"},
	{Name: "duplicate key", Doc: strings.Replace(Ev(), `"id":"evt-1"`, `"id":"evt-1","id":"evt-2"`, 1), GoOnly: "duplicate keys"},
	{Name: "lone surrogate", Doc: Ev("user", Q(`\ud800`)), GoOnly: "valid Unicode"},
	{Name: "bytes not characters", Doc: Ev("user", Q(strings.Repeat("é", 200))), GoOnly: "lengths in bytes"},
	{Name: "before 1970 in UTC", Doc: Ev("time", Q("1970-01-01T00:30:00+01:00")), GoOnly: "time range after applying the offset"},
	{Name: "after 2105 in UTC", Doc: Ev("time", Q("2105-12-31T23:30:00-01:00")), GoOnly: "time range after applying the offset"},
}

// CEDoc builds a CloudEvent document carrying data (left out when "-"),
// with envelope members overridden as in Ev.
func CEDoc(data string, overrides ...string) string {
	tail := ""
	if data != "-" {
		tail = `"data":` + data
	}
	return object([][2]string{
		{"specversion", Q("1.0")}, {"type", Q(schemas.CloudEventTypeUsageV1)}, {"source", Q("//gw.example.com/eu-1")},
		{"id", Q("evt-1")}, {"time", Q("2024-05-01T12:00:00Z")},
	}, overrides, tail)
}

// Payload is a usage event without id and time, as CloudEvents carry it.
var Payload = Ev("id", "-", "time", "-")

// CloudEventCorpus is the corpus of CloudEvents carrying usage events.
var CloudEventCorpus = []Case{
	{Name: "plain", Doc: CEDoc(Payload), Valid: true},
	{Name: "full", Doc: CEDoc(Ev("outcome", Q("ok"), "attributes", `{"a":"b"}`), "subject", Q("acme"), "datacontenttype", Q("application/json")), Valid: true},
	{Name: "time in data only", Doc: CEDoc(Ev("id", "-"), "time", "-"), Valid: true},
	{Name: "time null in envelope", Doc: CEDoc(Ev("id", "-"), "time", "null"), Valid: true},
	{Name: "extensions", Doc: CEDoc(Payload, "traceparent", Q("00-ab-cd-01"), "sampled", "true", "rank", "3", "nothing", "null"), Valid: true},
	{Name: "dataschema", Doc: CEDoc(Payload, "dataschema", Q("https://example.com/s.json")), Valid: true},
	{Name: "urn source", Doc: CEDoc(Payload, "source", Q("urn:sluice:gateway:eu-1")), Valid: true},
	{Name: "path source", Doc: CEDoc(Payload, "source", Q("/gateways/eu-1")), Valid: true},
	{Name: "optional nulls", Doc: CEDoc(Payload, "subject", "null", "datacontenttype", "null", "dataschema", "null"), Valid: true},
	{Name: "offset time", Doc: CEDoc(Payload, "time", Q("2024-05-01T14:00:00+02:00")), Valid: true},

	{Name: "specversion 0.3", Doc: CEDoc(Payload, "specversion", Q("0.3"))},
	{Name: "specversion missing", Doc: CEDoc(Payload, "specversion", "-")},
	{Name: "wrong type", Doc: CEDoc(Payload, "type", Q("com.example.usage"))},
	{Name: "source missing", Doc: CEDoc(Payload, "source", "-")},
	{Name: "source empty", Doc: CEDoc(Payload, "source", `""`)},
	{Name: "source invalid", Doc: CEDoc(Payload, "source", Q("%zz"))},
	{Name: "source backslash", Doc: CEDoc(Payload, "source", Q(`a\\b`))},
	{Name: "id missing", Doc: CEDoc(Payload, "id", "-")},
	{Name: "id space", Doc: CEDoc(Payload, "id", Q("a b"))},
	{Name: "time missing everywhere", Doc: CEDoc(Payload, "time", "-")},
	{Name: "time invalid", Doc: CEDoc(Payload, "time", Q("yesterday"))},
	{Name: "subject invalid", Doc: CEDoc(Payload, "subject", Q("a/b"))},
	{Name: "subject empty", Doc: CEDoc(Payload, "subject", `""`)},
	{Name: "datacontenttype", Doc: CEDoc(Payload, "datacontenttype", Q("text/plain"))},
	{Name: "dataschema empty", Doc: CEDoc(Payload, "dataschema", `""`)},
	{Name: "data missing", Doc: CEDoc("-")},
	{Name: "data null", Doc: CEDoc("null")},
	{Name: "data string", Doc: CEDoc(Q("{}"))},
	{Name: "data_base64", Doc: CEDoc(Payload, "data_base64", Q("e30="))},
	{Name: "extension upper case", Doc: CEDoc(Payload, "traceParent", Q("x"))},
	{Name: "extension underscore", Doc: CEDoc(Payload, "trace_id", Q("x"))},
	{Name: "extension object", Doc: CEDoc(Payload, "ext", `{"a":1}`)},
	{Name: "data wrong type", Doc: CEDoc(Ev("id", "-", "time", "-", "prompt_tokens", Q("1")))},
	{Name: "data unknown field", Doc: CEDoc(Ev("id", "-", "time", "-", "color", Q("blue")))},
	{Name: "data missing tenant", Doc: CEDoc(Ev("id", "-", "time", "-", "tenant", "-"))},
	{Name: "data bad time", Doc: CEDoc(Ev("id", "-", "time", Q("2024-05-01")))},

	{Name: "data id differs", Doc: CEDoc(Ev("id", Q("other"), "time", "-")), GoOnly: "comparison with the envelope"},
	{Name: "data time differs", Doc: CEDoc(Ev("id", "-", "time", Q("2024-05-01T12:00:01Z"))), GoOnly: "comparison with the envelope"},
	{Name: "subject differs", Doc: CEDoc(Payload, "subject", Q("globex")), GoOnly: "comparison with data"},
	{Name: "data cached above prompt", Doc: CEDoc(Ev("id", "-", "time", "-", "cached_tokens", "1201")), GoOnly: "comparison between two fields"},
}

// Sig builds a signal document; overrides as in Ev.
func Sig(overrides ...string) string {
	return object([][2]string{
		{"id", Q("5d41402abc4b2a76b9719d911017c592")}, {"kind", Q("tier_crossed")}, {"time", Q("2024-05-20T08:15:00Z")},
		{"tenant", Q("acme")}, {"model", Q("*")}, {"tier", "90"}, {"previous_tier", "70"}, {"direction", Q("up")},
	}, overrides, "")
}

// SignalCorpus is the corpus of signal documents.
var SignalCorpus = []Case{
	{Name: "tier crossed", Doc: Sig(), Valid: true},
	{Name: "full", Doc: Sig("quota", Q("monthly_tokens"), "period", Q("month"), "period_start", Q("2024-05-01T00:00:00+08:00"),
		"period_end", Q("2024-06-01T00:00:00+08:00"), "used", "9.05e7", "limit", "1e8", "unit", Q("tokens"), "rate", "41000.5",
		"mode", Q("hard"), "reason", Q("90%"), "source", `{"partition":3,"from_offset":1,"to_offset":2}`, "attributes", `{"a":"b"}`), Valid: true},
	{Name: "period reset", Doc: Sig("kind", Q("period_reset"), "direction", "-", "tier", "0", "previous_tier", "100"), Valid: true},
	{Name: "exhaustion predicted", Doc: Sig("kind", Q("exhaustion_predicted"), "direction", "-", "predicted_exhaustion", Q("2024-05-28T00:00:00Z")), Valid: true},
	{Name: "unknown fields", Doc: Sig("future", `{"x":[1]}`, "source", `{"partition":0,"leader_epoch":4}`), Valid: true},
	{Name: "nulls", Doc: Sig("quota", "null", "used", "null", "predicted_exhaustion", "null", "source", "null", "attributes", "null"), Valid: true},
	{Name: "tier down", Doc: Sig("tier", "70", "previous_tier", "90", "direction", Q("down")), Valid: true},
	{Name: "anomaly", Doc: Sig("kind", Q("anomaly"), "direction", "-", "tier", "-", "previous_tier", "-", "reason", Q("error ratio 0.4")), Valid: true},
	{Name: "tier max", Doc: Sig("tier", "1000"), Valid: true},
	{Name: "whole float tier", Doc: Sig("tier", "90.0"), Valid: true},
	{Name: "empty enums", Doc: Sig("quota", `""`, "period", `""`, "unit", `""`, "mode", `""`), Valid: true},

	{Name: "id missing", Doc: Sig("id", "-")},
	{Name: "kind missing", Doc: Sig("kind", "-")},
	{Name: "kind unknown", Doc: Sig("kind", Q("budget_forecast"))},
	{Name: "time missing", Doc: Sig("time", "-")},
	{Name: "time invalid", Doc: Sig("time", Q("2024-05-20"))},
	{Name: "tenant invalid", Doc: Sig("tenant", Q("a b"))},
	{Name: "model missing", Doc: Sig("model", "-")},
	{Name: "quota unknown", Doc: Sig("quota", Q("weekly_tokens"))},
	{Name: "period unknown", Doc: Sig("period", Q("week"))},
	{Name: "tier too high", Doc: Sig("tier", "1001")},
	{Name: "tier fraction", Doc: Sig("tier", "90.5")},
	{Name: "tier string", Doc: Sig("tier", Q("90"))},
	{Name: "direction missing", Doc: Sig("direction", "-")},
	{Name: "direction unknown", Doc: Sig("direction", Q("sideways"))},
	{Name: "used negative", Doc: Sig("used", "-1")},
	{Name: "rate string", Doc: Sig("rate", Q("1"))},
	{Name: "unit unknown", Doc: Sig("unit", Q("dollars"))},
	{Name: "mode unknown", Doc: Sig("mode", Q("strict"))},
	{Name: "predicted missing", Doc: Sig("kind", Q("exhaustion_predicted"))},
	{Name: "predicted invalid", Doc: Sig("predicted_exhaustion", Q("soon"))},
	{Name: "period_end without start", Doc: Sig("period_end", Q("2024-06-01T00:00:00Z"))},
	{Name: "period_start without end", Doc: Sig("period_start", Q("2024-05-01T00:00:00Z"))},
	{Name: "reason too long", Doc: Sig("reason", Q(strings.Repeat("r", 1025)))},
	{Name: "partition negative", Doc: Sig("source", `{"partition":-1}`)},
	{Name: "source array", Doc: Sig("source", `[]`)},
	{Name: "attribute number", Doc: Sig("attributes", `{"a":1}`)},

	{Name: "period end before start", Doc: Sig("period_start", Q("2024-06-01T00:00:00Z"), "period_end", Q("2024-05-01T00:00:00Z")), GoOnly: "comparison between two fields"},
	{Name: "to before from", Doc: Sig("source", `{"from_offset":5,"to_offset":4}`), GoOnly: "comparison between two fields"},
	{Name: "direction inconsistent", Doc: Sig("tier", "70", "previous_tier", "90"), GoOnly: "comparison between two fields"},
	{Name: "duplicate key", Doc: strings.Replace(Sig(), `"tier":90`, `"tier":90,"tier":70`, 1), GoOnly: "duplicate keys"},
}
