package eventjson

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// ce builds a structured CloudEvent from envelope members and a data object.
func ce(envelope, data string) string {
	s := `{"specversion":"1.0","type":"dev.sluice.usage.v1","source":"//gw.example.com/eu-1","id":"evt-1","time":"2024-05-01T12:00:00Z"`
	for _, kv := range strings.Split(envelope, ",,") {
		if kv == "" {
			continue
		}
		name := kv[:strings.Index(kv, ":")]
		if i := strings.Index(s, name+":"); i >= 0 {
			j := i + len(name) + 1
			k := strings.Index(s[j:], `","`)
			if k < 0 {
				k = len(s) - j - 1
			}
			s = s[:i] + kv + s[j+k+1:]
			continue
		}
		s += "," + kv
	}
	if data != "-" {
		s += `,"data":` + data
	}
	return s + "}"
}

const cePayload = `{"tenant":"acme","model":"gpt-4o","prompt_tokens":1200,"completion_tokens":350}`

func TestDecodeCloudEventTestdata(t *testing.T) {
	var ev schemas.UsageEvent
	if err := DecodeCloudEvent(schematest.ReadTestdata(t, "cloudevent.json"), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.ID != "01HZX3Q8J5W1K8S9V2M4N6P7R2" || ev.Tenant != "acme" || ev.LatencyMS != 1840 ||
		!ev.Time.Equal(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)) {
		t.Errorf("decoded %+v", ev)
	}
	n := 0
	err := framing.SplitJSONArray(schematest.ReadTestdata(t, "cloudevents-batch.json"), func(_ int, raw []byte) error {
		n++
		return DecodeCloudEvent(raw, &ev)
	})
	if err != nil || n != 2 {
		t.Errorf("batch: %v after %d", err, n)
	}
	if ev.ID != "ce-2" || ev.Time.IsZero() {
		t.Errorf("time from data not used: %+v", ev)
	}
}

func TestDecodeCloudEventAccepts(t *testing.T) {
	cases := []struct{ name, in string }{
		{"plain", ce("", cePayload)},
		{"data id and time equal", ce("", `{"id":"evt-1","time":"2024-05-01T14:00:00+02:00","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`)},
		{"time only in data", ce(`"time":null`, `{"time":"2024-05-01T12:00:00Z","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`)},
		{"subject equals tenant", ce(`"subject":"acme"`, cePayload)},
		{"extensions", ce(`"traceparent":"00-ab-cd-01",,"partitionkey":"acme",,"sampled":true,,"rank":3,,"nothing":null`, cePayload)},
		{"datacontenttype", ce(`"datacontenttype":"application/json",,"dataschema":"https://example.com/s.json"`, cePayload)},
		{"urn source", ce(`"source":"urn:sluice:gateway:eu-1"`, cePayload)},
		{"relative source", ce(`"source":"/gateways/eu-1"`, cePayload)},
		{"ipv6 source", ce(`"source":"//[::1]:8080/gw"`, cePayload)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ev schemas.UsageEvent
			if err := DecodeCloudEvent([]byte(tc.in), &ev); err != nil {
				t.Fatalf("%s: %v", tc.in, err)
			}
			if ev.ID != "evt-1" || ev.Time.IsZero() {
				t.Errorf("envelope not applied: %+v", ev)
			}
		})
	}
}

func TestDecodeCloudEventProblems(t *testing.T) {
	cases := []struct {
		name, in, field string
		want            []string
	}{
		{"specversion", ce(`"specversion":"0.3"`, cePayload), "specversion", []string{`"0.3"`, "1.0"}},
		{"type", ce(`"type":"com.example.usage"`, cePayload), "type", []string{schemas.CloudEventTypeUsageV1}},
		{"source empty", ce(`"source":""`, cePayload), "source", []string{"required"}},
		{"source bad", ce(`"source":"%zz"`, cePayload), "source", []string{"URI-reference"}},
		{"source backslash", ce(`"source":"a\\b"`, cePayload), "source", []string{"backslash"}},
		{"source null", ce(`"source":null`, cePayload), "source", []string{"null"}},
		{"id bad", ce(`"id":"a b"`, cePayload), "id", []string{"0x20"}},
		{"id number", ce(`"id":7`, cePayload), "id", []string{"must be a string"}},
		{"time bad", ce(`"time":"yesterday"`, cePayload), "time", []string{"RFC 3339"}},
		{"time missing everywhere", ce(`"time":null`, cePayload), "time", []string{"required"}},
		{"data id differs", ce("", `{"id":"other","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`), "data.id", []string{"other", "evt-1"}},
		{"data time differs", ce("", `{"time":"2024-05-01T12:00:01Z","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`), "data.time", []string{"same instant"}},
		{"subject differs", ce(`"subject":"globex"`, cePayload), "subject", []string{"globex", "acme"}},
		{"subject empty", ce(`"subject":""`, cePayload), "subject", []string{"empty"}},
		{"datacontenttype", ce(`"datacontenttype":"text/plain"`, cePayload), "datacontenttype", []string{"application/json"}},
		{"data missing", ce("", "-"), "data", []string{"required"}},
		{"data null", ce("", "null"), "data", []string{"required"}},
		{"data string", ce("", `"{}"`), "data", []string{"JSON object", "a string"}},
		{"data_base64", ce(`"data_base64":"e30="`, cePayload), "data_base64", []string{"not supported"}},
		{"bad extension name", ce(`"traceParent":"x"`, cePayload), "traceParent", []string{"lower-case"}},
		{"extension object", ce(`"ext":{"a":1}`, cePayload), "ext", []string{"an object"}},
		{"duplicate attribute", strings.Replace(ce("", cePayload), `"id":"evt-1"`, `"id":"evt-1","id":"evt-1"`, 1), "id", []string{"more than once"}},
		{"duplicate extension", strings.Replace(ce(`"ext":"a"`, cePayload), `"ext":"a"`, `"ext":"a","ext":"b"`, 1), "ext", []string{"more than once"}},
		{"data prompt_tokens", ce("", `{"tenant":"acme","model":"m","prompt_tokens":"1","completion_tokens":1}`), "data.prompt_tokens", []string{"integer"}},
		{"data unknown field", ce("", `{"tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1,"x":1}`), "data.x", []string{"not a field"}},
		{"data missing tenant", ce("", `{"model":"m","prompt_tokens":1,"completion_tokens":1}`), "data.tenant", []string{"required"}},
		{"data bad tenant", ce("", `{"tenant":"a b","model":"m","prompt_tokens":1,"completion_tokens":1}`), "data.tenant", []string{"0x20"}},
		{"data cached above prompt", ce("", `{"tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1,"cached_tokens":2}`), "data.cached_tokens", []string{"prompt_tokens"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ev schemas.UsageEvent
			err := DecodeCloudEvent([]byte(tc.in), &ev)
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

func TestDecodeCloudEventMissingAttributes(t *testing.T) {
	var ev schemas.UsageEvent
	ve := schematest.FieldErrors(t, DecodeCloudEvent([]byte(`{"data":`+cePayload+`}`), &ev))
	for _, f := range []string{"specversion", "type", "source", "id", "time"} {
		if !ve.Has(f) {
			t.Errorf("no problem for %s: %v", f, ve)
		}
	}
	if len(ve) != 5 {
		t.Errorf("want 5 problems, got %v", ve)
	}
}

func TestDecodeCloudEventSyntax(t *testing.T) {
	for _, in := range []string{"", "[]", ce("", cePayload) + "{}", `{"specversion":"1.0",`, `{"data":{"tenant":}}`} {
		var ev schemas.UsageEvent
		var se *schemas.SyntaxError
		if err := DecodeCloudEvent([]byte(in), &ev); !errors.As(err, &se) {
			t.Errorf("%q: want *schemas.SyntaxError, got %v", in, err)
		}
	}
}

func TestAppendCloudEventJSONRoundTrip(t *testing.T) {
	var ev schemas.UsageEvent
	if err := DecodeUsageEvent(schematest.ReadTestdata(t, "event-full.json"), &ev); err != nil {
		t.Fatal(err)
	}
	out := AppendCloudEventJSON(nil, "//gw.example.com/eu-1", &ev)
	var back schemas.UsageEvent
	if err := DecodeCloudEvent(out, &back); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if !schematest.EqualEvents(&ev, &back) {
		t.Errorf("changed:\n%+v\n%+v", ev, back)
	}
}
