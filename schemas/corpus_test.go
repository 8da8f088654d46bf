package schemas

import (
	"fmt"
	"strings"
)

// corpusCase is a document with the verdict both the Go decoder and the
// JSON Schema must reach. goOnly names a rule JSON Schema cannot express:
// the Go decoder rejects the document and the schema accepts it, and the
// agreement test checks exactly that, so the list of known differences
// stays true.
type corpusCase struct {
	name   string
	doc    string
	valid  bool
	goOnly string
}

// ev builds a usage event document from the required fields with some of
// them replaced or removed (value "-") and extra members appended.
func ev(overrides ...string) string {
	fields := [][2]string{
		{"id", `"evt-1"`}, {"time", `"2024-05-01T12:00:00Z"`}, {"tenant", `"acme"`},
		{"model", `"gpt-4o"`}, {"prompt_tokens", "1200"}, {"completion_tokens", "350"},
	}
	var extra []string
	for i := 0; i+1 < len(overrides); i += 2 {
		k, v := overrides[i], overrides[i+1]
		found := false
		for j := range fields {
			if fields[j][0] == k {
				fields[j][1], found = v, true
			}
		}
		if !found {
			extra = append(extra, `"`+k+`":`+v)
		}
	}
	var parts []string
	for _, f := range fields {
		if f[1] != "-" {
			parts = append(parts, `"`+f[0]+`":`+f[1])
		}
	}
	return "{" + strings.Join(append(parts, extra...), ",") + "}"
}

func attrs(n, keyLen, valLen int) string {
	var parts []string
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		k += strings.Repeat("x", max(0, keyLen-len(k)))
		parts = append(parts, fmt.Sprintf(`"%s":"%s"`, k, strings.Repeat("v", valLen)))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func q(s string) string { return `"` + s + `"` }

var usageCorpus = []corpusCase{
	// Accepted.
	{name: "minimal", doc: ev(), valid: true},
	{name: "typical", doc: ev("api_key_id", q("key_1"), "status", "200", "outcome", q("ok"), "latency_ms", "1840"), valid: true},
	{name: "all optional", doc: ev("user", q("u"), "api_key_id", q("k"), "provider", q("openai"), "endpoint", q("/v1/chat"),
		"cached_tokens", "1200", "status", "429", "outcome", q("rejected"), "latency_ms", "3", "priority", q("critical"),
		"session_id", q("s"), "estimated", "true", "gateway", q("gw"), "attributes", `{"team":"search"}`), valid: true},
	{name: "optional nulls", doc: ev("user", "null", "cached_tokens", "null", "status", "null", "outcome", "null",
		"priority", "null", "estimated", "null", "attributes", "null", "latency_ms", "null"), valid: true},
	{name: "empty enums and strings", doc: ev("outcome", `""`, "priority", `""`, "user", `""`, "gateway", `""`), valid: true},
	{name: "status zero", doc: ev("status", "0"), valid: true},
	{name: "status bounds", doc: ev("status", "100", "latency_ms", "3600000"), valid: true},
	{name: "status 599", doc: ev("status", "599", "latency_ms", "0"), valid: true},
	{name: "max tokens", doc: ev("prompt_tokens", "1000000000", "completion_tokens", "1000000000", "cached_tokens", "1000000000"), valid: true},
	{name: "zero tokens", doc: ev("prompt_tokens", "0", "completion_tokens", "0"), valid: true},
	{name: "whole fraction", doc: ev("prompt_tokens", "12.0", "completion_tokens", "1.5e1"), valid: true},
	{name: "exponent", doc: ev("prompt_tokens", "1e3", "completion_tokens", "250E-1", "status", "2e2"), valid: true},
	{name: "negative zero", doc: ev("prompt_tokens", "-0"), valid: true},
	{name: "time offset", doc: ev("time", q("2024-05-01T17:30:00+05:30")), valid: true},
	{name: "time negative offset", doc: ev("time", q("2024-05-01T07:00:00.5-05:00")), valid: true},
	{name: "time nanoseconds", doc: ev("time", q("2024-05-01T12:00:00.123456789Z")), valid: true},
	{name: "time leap day", doc: ev("time", q("2024-02-29T23:59:59Z")), valid: true},
	{name: "time epoch", doc: ev("time", q("1970-01-01T00:00:00Z")), valid: true},
	{name: "32 attributes", doc: ev("attributes", attrs(32, 64, 256)), valid: true},
	{name: "empty attributes", doc: ev("attributes", "{}"), valid: true},
	{name: "long id", doc: ev("id", q(strings.Repeat("x", 128))), valid: true},
	{name: "printable id", doc: ev("id", q(`!#$%&'()*+,-./09:;<=>?@AZ[]^_`+"`"+`az{|}~`)), valid: true},
	{name: "long tenant", doc: ev("tenant", q(strings.Repeat("t", 60)+"._:-")), valid: true},
	{name: "model with space", doc: ev("model", q("Llama 3 70B Instruct")), valid: true},
	{name: "long model", doc: ev("model", q(strings.Repeat("m", 128))), valid: true},
	{name: "escapes", doc: ev("model", q(`gpt\u002d4o`), "user", q(`a\"b\\c\/\n\t\u00e9\ud83d\ude00`)), valid: true},
	{name: "escaped key", doc: ev("\\u0075ser", q("x")), valid: true},
	{name: "unicode user", doc: ev("user", q("Jürgen 山田")), valid: true},
	{name: "long user", doc: ev("user", q(strings.Repeat("u", 256)), "session_id", q(strings.Repeat("s", 256))), valid: true},
	{name: "whitespace", doc: " \n" + strings.ReplaceAll(ev(), ",", " ,\n\t") + "\r\n", valid: true},

	// Rejected by both.
	{name: "missing id", doc: ev("id", "-")},
	{name: "missing time", doc: ev("time", "-")},
	{name: "missing tenant", doc: ev("tenant", "-")},
	{name: "missing model", doc: ev("model", "-")},
	{name: "missing prompt_tokens", doc: ev("prompt_tokens", "-")},
	{name: "missing completion_tokens", doc: ev("completion_tokens", "-")},
	{name: "unknown field", doc: ev("color", q("blue"))},
	{name: "unknown field null", doc: ev("color", "null")},
	{name: "string for integer", doc: ev("prompt_tokens", q("12"))},
	{name: "bool for integer", doc: ev("status", "true")},
	{name: "integer for string", doc: ev("tenant", "5")},
	{name: "string for bool", doc: ev("estimated", q("true"))},
	{name: "array for attributes", doc: ev("attributes", `["a"]`)},
	{name: "number attribute value", doc: ev("attributes", `{"a":1}`)},
	{name: "null attribute value", doc: ev("attributes", `{"a":null}`)},
	{name: "required null", doc: ev("tenant", "null")},
	{name: "required tokens null", doc: ev("completion_tokens", "null")},
	{name: "negative tokens", doc: ev("prompt_tokens", "-1")},
	{name: "negative cached", doc: ev("cached_tokens", "-1")},
	{name: "tokens over limit", doc: ev("completion_tokens", "1000000001")},
	{name: "tokens overflow", doc: ev("prompt_tokens", "99999999999999999999")},
	{name: "fraction", doc: ev("prompt_tokens", "1.5")},
	{name: "tiny fraction", doc: ev("latency_ms", "5.000000000000000001")},
	{name: "status 99", doc: ev("status", "99")},
	{name: "status 600", doc: ev("status", "600")},
	{name: "status negative", doc: ev("status", "-200")},
	{name: "outcome unknown", doc: ev("outcome", q("success"))},
	{name: "outcome case", doc: ev("outcome", q("OK"))},
	{name: "priority unknown", doc: ev("priority", q("urgent"))},
	{name: "latency over limit", doc: ev("latency_ms", "3600001")},
	{name: "latency negative", doc: ev("latency_ms", "-1")},
	{name: "user too long", doc: ev("user", q(strings.Repeat("u", 257)))},
	{name: "gateway too long", doc: ev("gateway", q(strings.Repeat("g", 300)))},
	{name: "33 attributes", doc: ev("attributes", attrs(33, 2, 1))},
	{name: "attribute key space", doc: ev("attributes", `{"a b":"x"}`)},
	{name: "attribute key empty", doc: ev("attributes", `{"":"x"}`)},
	{name: "attribute key too long", doc: ev("attributes", attrs(1, 65, 1))},
	{name: "attribute value too long", doc: ev("attributes", attrs(1, 3, 257))},
	{name: "id empty", doc: ev("id", `""`)},
	{name: "id space", doc: ev("id", q("a b"))},
	{name: "id too long", doc: ev("id", q(strings.Repeat("x", 129)))},
	{name: "id unicode", doc: ev("id", q("é"))},
	{name: "tenant slash", doc: ev("tenant", q("acme/prod"))},
	{name: "tenant too long", doc: ev("tenant", q(strings.Repeat("t", 65)))},
	{name: "tenant empty", doc: ev("tenant", `""`)},
	{name: "model newline", doc: ev("model", q(`gpt\n4`))},
	{name: "model too long", doc: ev("model", q(strings.Repeat("m", 129)))},
	{name: "model tab", doc: ev("model", q(`a\tb`))},
	{name: "time date only", doc: ev("time", q("2024-05-01"))},
	{name: "time space", doc: ev("time", q("2024-05-01 12:00:00Z"))},
	{name: "time lower case", doc: ev("time", q("2024-05-01t12:00:00z"))},
	{name: "time no zone", doc: ev("time", q("2024-05-01T12:00:00"))},
	{name: "time hour 24", doc: ev("time", q("2024-05-01T24:00:00Z"))},
	{name: "time leap second", doc: ev("time", q("2016-12-31T23:59:60Z"))},
	{name: "time feb 30", doc: ev("time", q("2024-02-30T12:00:00Z"))},
	{name: "time 1969", doc: ev("time", q("1969-12-31T23:59:59Z"))},
	{name: "time ten fraction digits", doc: ev("time", q("2024-05-01T12:00:00.1234567891Z"))},
	{name: "time comma", doc: ev("time", q("2024-05-01T12:00:00,5Z"))},
	{name: "time unix", doc: ev("time", "1714564800")},
	{name: "time offset without colon", doc: ev("time", q("2024-05-01T12:00:00+0200"))},
	{name: "not an object", doc: `[` + ev() + `]`},
	{name: "string document", doc: `"event"`},

	// Rejected by Go only: rules JSON Schema cannot express.
	{name: "cached above prompt", doc: ev("cached_tokens", "1201"), goOnly: "comparison between two fields"},
	{name: "duplicate key", doc: strings.Replace(ev(), `"id":"evt-1"`, `"id":"evt-1","id":"evt-2"`, 1), goOnly: "duplicate keys"},
	{name: "lone surrogate", doc: ev("user", q(`\ud800`)), goOnly: "valid Unicode"},
	{name: "bytes not characters", doc: ev("user", q(strings.Repeat("é", 200))), goOnly: "lengths in bytes"},
	{name: "before 1970 in UTC", doc: ev("time", q("1970-01-01T00:30:00+01:00")), goOnly: "time range after applying the offset"},
}

// ce builds a CloudEvent document; overrides as in ev, with data last.
func ceDoc(data string, overrides ...string) string {
	fields := [][2]string{
		{"specversion", q("1.0")}, {"type", q(CloudEventTypeUsageV1)}, {"source", q("//gw.example.com/eu-1")},
		{"id", q("evt-1")}, {"time", q("2024-05-01T12:00:00Z")},
	}
	var extra []string
	for i := 0; i+1 < len(overrides); i += 2 {
		k, v := overrides[i], overrides[i+1]
		found := false
		for j := range fields {
			if fields[j][0] == k {
				fields[j][1], found = v, true
			}
		}
		if !found {
			extra = append(extra, `"`+k+`":`+v)
		}
	}
	var parts []string
	for _, f := range fields {
		if f[1] != "-" {
			parts = append(parts, `"`+f[0]+`":`+f[1])
		}
	}
	parts = append(parts, extra...)
	if data != "-" {
		parts = append(parts, `"data":`+data)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// payload is a usage event without id and time, as CloudEvents carry it.
var payload = ev("id", "-", "time", "-")

var cloudEventCorpus = []corpusCase{
	{name: "plain", doc: ceDoc(payload), valid: true},
	{name: "full", doc: ceDoc(ev("outcome", q("ok"), "attributes", `{"a":"b"}`), "subject", q("acme"), "datacontenttype", q("application/json")), valid: true},
	{name: "time in data only", doc: ceDoc(ev("id", "-"), "time", "-"), valid: true},
	{name: "time null in envelope", doc: ceDoc(ev("id", "-"), "time", "null"), valid: true},
	{name: "extensions", doc: ceDoc(payload, "traceparent", q("00-ab-cd-01"), "sampled", "true", "rank", "3", "nothing", "null"), valid: true},
	{name: "dataschema", doc: ceDoc(payload, "dataschema", q("https://example.com/s.json")), valid: true},
	{name: "urn source", doc: ceDoc(payload, "source", q("urn:sluice:gateway:eu-1")), valid: true},
	{name: "path source", doc: ceDoc(payload, "source", q("/gateways/eu-1")), valid: true},
	{name: "optional nulls", doc: ceDoc(payload, "subject", "null", "datacontenttype", "null", "dataschema", "null"), valid: true},
	{name: "offset time", doc: ceDoc(payload, "time", q("2024-05-01T14:00:00+02:00")), valid: true},

	{name: "specversion 0.3", doc: ceDoc(payload, "specversion", q("0.3"))},
	{name: "specversion missing", doc: ceDoc(payload, "specversion", "-")},
	{name: "wrong type", doc: ceDoc(payload, "type", q("com.example.usage"))},
	{name: "source missing", doc: ceDoc(payload, "source", "-")},
	{name: "source empty", doc: ceDoc(payload, "source", `""`)},
	{name: "source invalid", doc: ceDoc(payload, "source", q("%zz"))},
	{name: "source backslash", doc: ceDoc(payload, "source", q(`a\\b`))},
	{name: "id missing", doc: ceDoc(payload, "id", "-")},
	{name: "id space", doc: ceDoc(payload, "id", q("a b"))},
	{name: "time missing everywhere", doc: ceDoc(payload, "time", "-")},
	{name: "time invalid", doc: ceDoc(payload, "time", q("yesterday"))},
	{name: "subject invalid", doc: ceDoc(payload, "subject", q("a/b"))},
	{name: "subject empty", doc: ceDoc(payload, "subject", `""`)},
	{name: "datacontenttype", doc: ceDoc(payload, "datacontenttype", q("text/plain"))},
	{name: "dataschema empty", doc: ceDoc(payload, "dataschema", `""`)},
	{name: "data missing", doc: ceDoc("-")},
	{name: "data null", doc: ceDoc("null")},
	{name: "data string", doc: ceDoc(q("{}"))},
	{name: "data_base64", doc: ceDoc(payload, "data_base64", q("e30="))},
	{name: "extension upper case", doc: ceDoc(payload, "traceParent", q("x"))},
	{name: "extension underscore", doc: ceDoc(payload, "trace_id", q("x"))},
	{name: "extension object", doc: ceDoc(payload, "ext", `{"a":1}`)},
	{name: "data wrong type", doc: ceDoc(ev("id", "-", "time", "-", "prompt_tokens", q("1")))},
	{name: "data unknown field", doc: ceDoc(ev("id", "-", "time", "-", "color", q("blue")))},
	{name: "data missing tenant", doc: ceDoc(ev("id", "-", "time", "-", "tenant", "-"))},
	{name: "data bad time", doc: ceDoc(ev("id", "-", "time", q("2024-05-01")))},

	{name: "data id differs", doc: ceDoc(ev("id", q("other"), "time", "-")), goOnly: "comparison with the envelope"},
	{name: "data time differs", doc: ceDoc(ev("id", "-", "time", q("2024-05-01T12:00:01Z"))), goOnly: "comparison with the envelope"},
	{name: "subject differs", doc: ceDoc(payload, "subject", q("globex")), goOnly: "comparison with data"},
	{name: "data cached above prompt", doc: ceDoc(ev("id", "-", "time", "-", "cached_tokens", "1201")), goOnly: "comparison between two fields"},
}

// sig builds a signal document; overrides as in ev.
func sig(overrides ...string) string {
	fields := [][2]string{
		{"id", q("5d41402abc4b2a76b9719d911017c592")}, {"kind", q("tier_crossed")}, {"time", q("2024-05-20T08:15:00Z")},
		{"tenant", q("acme")}, {"model", q("*")}, {"tier", "90"}, {"previous_tier", "70"}, {"direction", q("up")},
	}
	var extra []string
	for i := 0; i+1 < len(overrides); i += 2 {
		k, v := overrides[i], overrides[i+1]
		found := false
		for j := range fields {
			if fields[j][0] == k {
				fields[j][1], found = v, true
			}
		}
		if !found {
			extra = append(extra, `"`+k+`":`+v)
		}
	}
	var parts []string
	for _, f := range fields {
		if f[1] != "-" {
			parts = append(parts, `"`+f[0]+`":`+f[1])
		}
	}
	return "{" + strings.Join(append(parts, extra...), ",") + "}"
}

var signalCorpus = []corpusCase{
	{name: "tier crossed", doc: sig(), valid: true},
	{name: "full", doc: sig("quota", q("monthly_tokens"), "period", q("month"), "period_start", q("2024-05-01T00:00:00+08:00"),
		"period_end", q("2024-06-01T00:00:00+08:00"), "used", "9.05e7", "limit", "1e8", "unit", q("tokens"), "rate", "41000.5",
		"mode", q("hard"), "reason", q("90%"), "source", `{"partition":3,"from_offset":1,"to_offset":2}`, "attributes", `{"a":"b"}`), valid: true},
	{name: "period reset", doc: sig("kind", q("period_reset"), "direction", "-", "tier", "0", "previous_tier", "100"), valid: true},
	{name: "exhaustion predicted", doc: sig("kind", q("exhaustion_predicted"), "direction", "-", "predicted_exhaustion", q("2024-05-28T00:00:00Z")), valid: true},
	{name: "unknown fields", doc: sig("future", `{"x":[1]}`, "source", `{"partition":0,"leader_epoch":4}`), valid: true},
	{name: "nulls", doc: sig("quota", "null", "used", "null", "predicted_exhaustion", "null", "source", "null", "attributes", "null"), valid: true},
	{name: "tier down", doc: sig("tier", "70", "previous_tier", "90", "direction", q("down")), valid: true},
	{name: "anomaly", doc: sig("kind", q("anomaly"), "direction", "-", "tier", "-", "previous_tier", "-", "reason", q("error ratio 0.4")), valid: true},
	{name: "tier max", doc: sig("tier", "1000"), valid: true},
	{name: "whole float tier", doc: sig("tier", "90.0"), valid: true},
	{name: "empty enums", doc: sig("quota", `""`, "period", `""`, "unit", `""`, "mode", `""`), valid: true},

	{name: "id missing", doc: sig("id", "-")},
	{name: "kind missing", doc: sig("kind", "-")},
	{name: "kind unknown", doc: sig("kind", q("budget_forecast"))},
	{name: "time missing", doc: sig("time", "-")},
	{name: "time invalid", doc: sig("time", q("2024-05-20"))},
	{name: "tenant invalid", doc: sig("tenant", q("a b"))},
	{name: "model missing", doc: sig("model", "-")},
	{name: "quota unknown", doc: sig("quota", q("weekly_tokens"))},
	{name: "period unknown", doc: sig("period", q("week"))},
	{name: "tier too high", doc: sig("tier", "1001")},
	{name: "tier fraction", doc: sig("tier", "90.5")},
	{name: "tier string", doc: sig("tier", q("90"))},
	{name: "direction missing", doc: sig("direction", "-")},
	{name: "direction unknown", doc: sig("direction", q("sideways"))},
	{name: "used negative", doc: sig("used", "-1")},
	{name: "rate string", doc: sig("rate", q("1"))},
	{name: "unit unknown", doc: sig("unit", q("dollars"))},
	{name: "mode unknown", doc: sig("mode", q("strict"))},
	{name: "predicted missing", doc: sig("kind", q("exhaustion_predicted"))},
	{name: "predicted invalid", doc: sig("predicted_exhaustion", q("soon"))},
	{name: "period_end without start", doc: sig("period_end", q("2024-06-01T00:00:00Z"))},
	{name: "period_start without end", doc: sig("period_start", q("2024-05-01T00:00:00Z"))},
	{name: "reason too long", doc: sig("reason", q(strings.Repeat("r", 1025)))},
	{name: "partition negative", doc: sig("source", `{"partition":-1}`)},
	{name: "source array", doc: sig("source", `[]`)},
	{name: "attribute number", doc: sig("attributes", `{"a":1}`)},

	{name: "period end before start", doc: sig("period_start", q("2024-06-01T00:00:00Z"), "period_end", q("2024-05-01T00:00:00Z")), goOnly: "comparison between two fields"},
	{name: "to before from", doc: sig("source", `{"from_offset":5,"to_offset":4}`), goOnly: "comparison between two fields"},
	{name: "direction inconsistent", doc: sig("tier", "70", "previous_tier", "90"), goOnly: "comparison between two fields"},
	{name: "duplicate key", doc: strings.Replace(sig(), `"tier":90`, `"tier":90,"tier":70`, 1), goOnly: "duplicate keys"},
}
