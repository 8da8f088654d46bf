package eventjson

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// event builds a JSON event from the required fields plus extra members,
// which override required ones of the same name.
func event(extra string) string {
	base := map[string]string{
		"id": `"evt-1"`, "time": `"2024-05-01T12:00:00Z"`, "tenant": `"acme"`,
		"model": `"gpt-4o"`, "prompt_tokens": "1200", "completion_tokens": "350",
	}
	order := []string{"id", "time", "tenant", "model", "prompt_tokens", "completion_tokens"}
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, k := range order {
		if strings.Contains(extra, `"`+k+`":`) {
			continue
		}
		if !first {
			b.WriteString(",")
		}
		first = false
		b.WriteString(`"` + k + `":` + base[k])
	}
	if extra != "" {
		if !first {
			b.WriteString(",")
		}
		b.WriteString(extra)
	}
	b.WriteString("}")
	return b.String()
}

// without builds the base event with one required field removed.
func without(field string) string {
	var parts []string
	for _, kv := range []string{`"id":"evt-1"`, `"time":"2024-05-01T12:00:00Z"`, `"tenant":"acme"`,
		`"model":"gpt-4o"`, `"prompt_tokens":1200`, `"completion_tokens":350`} {
		if !strings.HasPrefix(kv, `"`+field+`":`) {
			parts = append(parts, kv)
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func TestDecodeTestdata(t *testing.T) {
	for _, name := range []string{"event-minimal.json", "event-typical.json", "event-full.json"} {
		var ev schemas.UsageEvent
		if err := DecodeUsageEvent(schematest.ReadTestdata(t, name), &ev); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	var ev schemas.UsageEvent
	if err := DecodeUsageEvent(schematest.ReadTestdata(t, "event-full.json"), &ev); err != nil {
		t.Fatal(err)
	}
	want := schemas.UsageEvent{
		ID: "01HZX3Q8J5W1K8S9V2M4N6P7R1", Time: time.Date(2024, 5, 1, 12, 0, 0, 123456789, time.UTC),
		Tenant: "acme.eu:team-7", Model: "claude-3-5-sonnet@20240620", PromptTokens: 5000, CompletionTokens: 800,
		User: "user-42", APIKeyID: "key_7f3a9c", Provider: "anthropic", Endpoint: "/v1/messages",
		CachedTokens: 4096, CacheWriteTokens: 512, ReasoningTokens: 300, Status: 200, Outcome: schemas.OutcomeOK, LatencyMS: 9120, Priority: schemas.PriorityHigh,
		SessionID: "agent-task-9", Gateway: "gw-eu-1",
		Attributes: map[string]string{"team": "search", "feature": "summarize", "region": "eu-west-1"},
	}
	if !schematest.EqualEvents(&ev, &want) {
		t.Errorf("got %+v\nwant %+v", ev, want)
	}
	if ev.Time.Location() != time.UTC {
		t.Errorf("time not in UTC: %v", ev.Time.Location())
	}
}

func TestDecodeFieldProblems(t *testing.T) {
	cases := []struct {
		name, in, field string
		want            []string
	}{
		{"string for integer", event(`"prompt_tokens":"12"`), "prompt_tokens", []string{"integer", "a string"}},
		{"integer for string", event(`"tenant":5`), "tenant", []string{"must be a string", "a number"}},
		{"object for string", event(`"user":{"a":1}`), "user", []string{"an object"}},
		{"string for bool", event(`"estimated":"yes"`), "estimated", []string{"true or false", "a string"}},
		{"array for attributes", event(`"attributes":["a"]`), "attributes", []string{"object", "an array"}},
		{"number attribute", event(`"attributes":{"n":1}`), "attributes.n", []string{"must be a string"}},
		{"null attribute", event(`"attributes":{"n":null}`), "attributes.n", []string{"must be a string", "null"}},
		{"bool for status", event(`"status":true`), "status", []string{"integer", "a boolean"}},
		{"unknown field", event(`"foo":{"nested":[1,2,{"x":"]"}]}`), "foo", []string{"not a field", "attributes"}},
		{"unknown field case", event(`"Tenant":"acme"`), "Tenant", []string{"not a field"}},
		{"duplicate field", `{"id":"a","id":"a","time":"2024-05-01T12:00:00Z","tenant":"t","model":"m","prompt_tokens":1,"completion_tokens":1}`, "id", []string{"more than once"}},
		{"duplicate attribute", event(`"attributes":{"a":"1","a":"2"}`), "attributes.a", []string{"more than once"}},
		{"overflow int64", event(`"prompt_tokens":99999999999999999999`), "prompt_tokens", []string{"out of range", "1000000000", "schemas.MaxTokensPerEvent"}},
		{"overflow 19 digits", event(`"completion_tokens":9999999999999999999`), "completion_tokens", []string{"out of range"}},
		{"over limit", event(`"prompt_tokens":1000000001`), "prompt_tokens", []string{"1000000000"}},
		{"fraction", event(`"prompt_tokens":1.5`), "prompt_tokens", []string{"1.5", "whole number"}},
		{"small fraction", event(`"latency_ms":10.000000000000000001`), "latency_ms", []string{"whole number"}},
		{"negative exponent", event(`"prompt_tokens":15e-1`), "prompt_tokens", []string{"whole number"}},
		{"huge exponent", event(`"prompt_tokens":1e401`), "prompt_tokens", []string{"exponent"}},
		{"latency overflow", event(`"latency_ms":1e30`), "latency_ms", []string{"out of range", "3600000", "MaxLatencyMS"}},
		{"status overflow", event(`"status":1e18`), "status", []string{"out of range"}},
		{"negative tokens", event(`"cached_tokens":-3`), "cached_tokens", []string{"negative"}},
		{"required null", event(`"tenant":null`), "tenant", []string{"required", "null"}},
		{"required tokens null", event(`"prompt_tokens":null`), "prompt_tokens", []string{"required", "null"}},
		{"missing id", without("id"), "id", []string{"required"}},
		{"missing time", without("time"), "time", []string{"required"}},
		{"missing prompt", without("prompt_tokens"), "prompt_tokens", []string{"required"}},
		{"missing completion", without("completion_tokens"), "completion_tokens", []string{"required"}},
		{"lone surrogate", event(`"user":"\ud800x"`), "user", []string{"surrogate"}},
		{"lone low surrogate", event(`"user":"\udc00"`), "user", []string{"surrogate"}},
		{"high then high", event(`"user":"\ud800\ud800"`), "user", []string{"surrogate"}},
		{"raw invalid utf8", event("\"user\":\"\xff\xfe\""), "user", []string{"UTF-8"}},
		{"escaped tenant bad char", event(`"tenant":"a\u0020b"`), "tenant", []string{"0x20"}},
		{"time date only", event(`"time":"2024-05-01"`), "time", []string{"RFC 3339"}},
		{"time space", event(`"time":"2024-05-01 12:00:00Z"`), "time", []string{"RFC 3339"}},
		{"time lower t", event(`"time":"2024-05-01t12:00:00Z"`), "time", []string{"RFC 3339"}},
		{"time no zone", event(`"time":"2024-05-01T12:00:00"`), "time", []string{"RFC 3339"}},
		{"time feb 30", event(`"time":"2024-02-30T12:00:00Z"`), "time", []string{"calendar date"}},
		{"time feb 29 non-leap", event(`"time":"2023-02-29T12:00:00Z"`), "time", []string{"calendar date"}},
		{"time hour 24", event(`"time":"2024-05-01T24:00:00Z"`), "time", []string{"time of day"}},
		{"time leap second", event(`"time":"2016-12-31T23:59:60Z"`), "time", []string{"leap"}},
		{"time 10 digit fraction", event(`"time":"2024-05-01T12:00:00.1234567891Z"`), "time", []string{"1 to 9 digits"}},
		{"time comma fraction", event(`"time":"2024-05-01T12:00:00,5Z"`), "time", []string{"RFC 3339"}},
		{"time bad offset", event(`"time":"2024-05-01T12:00:00+24:00"`), "time", []string{"offset"}},
		{"time before 1970", event(`"time":"1969-12-31T23:59:59Z"`), "time", []string{"1970"}},
		{"time offset before 1970", event(`"time":"1970-01-01T00:30:00+01:00"`), "time", []string{"1970"}},
		{"time number", event(`"time":1714564800`), "time", []string{"must be a string"}},
		{"outcome unknown", event(`"outcome":"OK"`), "outcome", []string{`"OK"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ev schemas.UsageEvent
			err := DecodeUsageEvent([]byte(tc.in), &ev)
			if err == nil {
				t.Fatalf("accepted %s", tc.in)
			}
			schematest.WantFieldError(t, err, tc.field, tc.want...)
			if ve := schematest.FieldErrors(t, err); len(ve) != 1 {
				t.Errorf("want one problem, got %v", err)
			}
		})
	}
}

func TestDecodeReportsAllProblems(t *testing.T) {
	in := `{"id":"evt-1","time":"2024-05-01T12:00:00Z","tenant":"acme corp","model":"gpt-4o",
		"prompt_tokens":"12","completion_tokens":350,"color":"blue"}`
	var ev schemas.UsageEvent
	ve := schematest.FieldErrors(t, DecodeUsageEvent([]byte(in), &ev))
	if len(ve) != 3 {
		t.Fatalf("want 3 problems, got %d: %v", len(ve), ve)
	}
	for _, f := range []string{"tenant", "prompt_tokens", "color"} {
		if !ve.Has(f) {
			t.Errorf("no problem for %s in %v", f, ve)
		}
	}
}

func TestDecodeAccepts(t *testing.T) {
	cases := []struct {
		name, in string
		check    func(*schemas.UsageEvent) bool
	}{
		{"escapes", event(`"user":"a\"b\\c\/d\b\f\n\r\t\u00e9\u20ac"`), func(e *schemas.UsageEvent) bool {
			return e.User == "a\"b\\c/d\b\f\n\r\t\u00e9\u20ac"
		}},
		{"surrogate pair", event(`"user":"\ud83d\ude00!"`), func(e *schemas.UsageEvent) bool { return e.User == "😀!" }},
		{"upper hex", event(`"user":"\uD83D\uDE00"`), func(e *schemas.UsageEvent) bool { return e.User == "😀" }},
		{"escaped key", event(`"\u0075ser":"x"`), func(e *schemas.UsageEvent) bool { return e.User == "x" }},
		{"escaped model", event(`"model":"gpt\u002d4o"`), func(e *schemas.UsageEvent) bool { return e.Model == "gpt-4o" }},
		{"raw utf8", event(`"user":"Jürgen 山田"`), func(e *schemas.UsageEvent) bool { return e.User == "Jürgen 山田" }},
		{"null optionals", event(`"user":null,"cached_tokens":null,"status":null,"outcome":null,"estimated":null,"attributes":null`),
			func(e *schemas.UsageEvent) bool { return e.User == "" && e.Attributes == nil && !e.Estimated }},
		{"empty enums", event(`"outcome":"","priority":""`), func(e *schemas.UsageEvent) bool { return e.Outcome == "" }},
		{"empty attributes", event(`"attributes":{}`), func(e *schemas.UsageEvent) bool { return e.Attributes == nil }},
		{"whole fraction", event(`"prompt_tokens":12.0,"completion_tokens":1.2e1`), func(e *schemas.UsageEvent) bool {
			return e.PromptTokens == 12 && e.CompletionTokens == 12
		}},
		{"exponent", event(`"prompt_tokens":1E3,"completion_tokens":25000e-2`), func(e *schemas.UsageEvent) bool {
			return e.PromptTokens == 1000 && e.CompletionTokens == 250
		}},
		{"zeros", event(`"prompt_tokens":-0,"completion_tokens":0.000e5`), func(e *schemas.UsageEvent) bool {
			return e.PromptTokens == 0 && e.CompletionTokens == 0
		}},
		{"offset time", event(`"time":"2024-05-01T14:30:00.5+02:30"`), func(e *schemas.UsageEvent) bool {
			return e.Time.Equal(time.Date(2024, 5, 1, 12, 0, 0, 5e8, time.UTC))
		}},
		{"negative offset", event(`"time":"2024-05-01T00:00:00-05:00"`), func(e *schemas.UsageEvent) bool {
			return e.Time.Equal(time.Date(2024, 5, 1, 5, 0, 0, 0, time.UTC))
		}},
		{"leap day", event(`"time":"2024-02-29T00:00:00Z"`), func(e *schemas.UsageEvent) bool { return e.Time.Day() == 29 }},
		{"whitespace", " \n\t{ \"id\" : \"x\" , \"time\":\"2024-05-01T12:00:00Z\",\"tenant\":\"t\",\"model\":\"m\",\"prompt_tokens\" :1,\"completion_tokens\": 2 } \r\n",
			func(e *schemas.UsageEvent) bool { return e.ID == "x" && e.CompletionTokens == 2 }},
		{"estimated", event(`"estimated":true`), func(e *schemas.UsageEvent) bool { return e.Estimated }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ev schemas.UsageEvent
			if err := DecodeUsageEvent([]byte(tc.in), &ev); err != nil {
				t.Fatal(err)
			}
			if !tc.check(&ev) {
				t.Errorf("decoded %+v", ev)
			}
		})
	}
}

func TestDecodeSyntaxErrors(t *testing.T) {
	deep := event(`"x":` + strings.Repeat("[", schemas.MaxNesting+1) + strings.Repeat("]", schemas.MaxNesting+1))
	cases := []struct {
		name, in string
		offset   int64
	}{
		{"empty", "", 0},
		{"blank", "  \n", 3},
		{"array", `[{}]`, 0},
		{"string", `"x"`, 0},
		{"trailing garbage", event("") + " x", int64(len(event("")) + 1)},
		{"two objects", event("") + event(""), int64(len(event("")))},
		{"unterminated object", `{"id":"x"`, 9},
		{"unterminated string", `{"id":"x`, 6},
		{"missing colon", `{"id" "x"}`, 6},
		{"unquoted key", `{id:"x"}`, 1},
		{"trailing comma", `{"id":"x",}`, 10},
		{"control char", "{\"id\":\"a\nb\"}", 8},
		{"bad escape", `{"id":"a\x"}`, 8},
		{"short unicode escape", `{"id":"\u12"}`, 7},
		{"leading zero", `{"prompt_tokens":012}`, 18},
		{"bare minus", `{"prompt_tokens":-}`, 18},
		{"dot without digits", `{"prompt_tokens":1.}`, 19},
		{"bad literal", `{"estimated":tru}`, 13},
		{"single quotes", `{'id':'x'}`, 1},
		{"too deep", deep, -1},
		{"NaN", `{"prompt_tokens":NaN}`, 17},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ev schemas.UsageEvent
			err := DecodeUsageEvent([]byte(tc.in), &ev)
			var se *schemas.SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("want *schemas.SyntaxError, got %T %v", err, err)
			}
			if tc.offset >= 0 && se.Offset != tc.offset {
				t.Errorf("offset %d, want %d (%v)", se.Offset, tc.offset, se)
			}
			if !strings.Contains(se.Error(), "byte") {
				t.Errorf("message %q lacks the offset", se.Error())
			}
		})
	}
}

func TestDecodeResetsEvent(t *testing.T) {
	var ev schemas.UsageEvent
	if err := DecodeUsageEvent(schematest.ReadTestdata(t, "event-full.json"), &ev); err != nil {
		t.Fatal(err)
	}
	if err := DecodeUsageEvent(schematest.ReadTestdata(t, "event-minimal.json"), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Attributes != nil || ev.User != "" || ev.Status != 0 {
		t.Errorf("fields survived the reset: %+v", ev)
	}
}

func TestDecodeDoesNotRetainInput(t *testing.T) {
	buf := schematest.ReadTestdata(t, "event-typical.json")
	var ev schemas.UsageEvent
	if err := DecodeUsageEvent(buf, &ev); err != nil {
		t.Fatal(err)
	}
	tenant := ev.Tenant
	for i := range buf {
		buf[i] = 'X'
	}
	if ev.Tenant != tenant || ev.Tenant != "acme-prod" {
		t.Errorf("event changed with the input buffer: %q", ev.Tenant)
	}
}

func TestDecodeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	data := schematest.ReadTestdata(t, "event-typical.json")
	var ev schemas.UsageEvent
	n := testing.AllocsPerRun(200, func() {
		if err := DecodeUsageEvent(data, &ev); err != nil {
			t.Fatal(err)
		}
	})
	if n > 2 {
		t.Errorf("DecodeUsageEvent allocates %v times per typical event; the budget is 2", n)
	}
}

// TestAttributeBombIsBounded: an event whose attributes object holds a
// huge number of entries — valid ones, or ones with the wrong type — keeps
// at most MaxAttributes of them and reports at most MaxProblemsPerEvent
// problems (plus the "more not listed" line), however many there are; it
// used to become a 769,000-entry map and 705,000 problems.
func TestAttributeBombIsBounded(t *testing.T) {
	const entries = 200_000
	for name, entry := range map[string]func(i int) string{
		"valid entries":   func(i int) string { return fmt.Sprintf(`"k%d":"v"`, i) },
		"invalid entries": func(i int) string { return fmt.Sprintf(`"k%d":%d`, i, i) },
		"invalid keys":    func(i int) string { return fmt.Sprintf(`"bad key %d":"v"`, i) },
	} {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString(`"attributes":{`)
			for i := range entries {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(entry(i))
			}
			b.WriteByte('}')
			var ev schemas.UsageEvent
			err := DecodeUsageEvent([]byte(event(b.String())), &ev)
			var ve schemas.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a ValidationError", err)
			}
			if len(ev.Attributes) > schemas.MaxAttributes {
				t.Errorf("decoded %d attributes; at most %d may be kept", len(ev.Attributes), schemas.MaxAttributes)
			}
			if len(ve) > schemas.MaxProblemsPerEvent+1 {
				t.Errorf("%d problems reported; at most %d plus one", len(ve), schemas.MaxProblemsPerEvent)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("has %d entries; the maximum is 32 (MaxAttributes)", entries)) {
				t.Errorf("error does not name the count and the limit: %.300s", err)
			}
		})
	}
}

func TestProblemsPerEventAreCapped(t *testing.T) {
	var ve schemas.ValidationError
	for i := range 1000 {
		ve.Add("", fmt.Sprintf("f%d", i), "bad")
	}
	if len(ve) != schemas.MaxProblemsPerEvent+1 || ve[len(ve)-1].Reason != schemas.TruncatedProblems {
		t.Fatalf("%d problems, last %+v; want %d and the truncation note", len(ve), ve[len(ve)-1], schemas.MaxProblemsPerEvent+1)
	}
}

// TestAttributeBombAllocatesLittle: decoding an 8 MiB body (max_body_bytes)
// of one-byte attribute entries allocates about the body's one copy, not a
// map of every entry (88 MB before the cap).
func TestAttributeBombAllocatesLittle(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation figures")
	}
	var b strings.Builder
	b.WriteString(`"attributes":{`)
	for i := 0; b.Len() < 8<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%x":""`, i)
	}
	b.WriteByte('}')
	body := []byte(event(b.String()))
	var ev schemas.UsageEvent
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_ = DecodeUsageEvent(body, &ev)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 2*uint64(len(body)) {
		t.Fatalf("decoding a %d-byte attribute bomb allocated %d bytes; want about one copy of the body", len(body), got)
	}
}
