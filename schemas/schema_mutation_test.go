package schemas

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// mutationValues is a pool of JSON values that the mutation test puts into
// every field in turn: each type, each boundary of each limit, and the
// usual ways of getting a timestamp or an enum wrong.
var mutationValues = []string{
	`null`, `""`, `"x"`, `"acme"`, `"ok"`, `"high"`, `"up"`, `"down"`, `"tokens"`, `"hard"`, `"month"`,
	`"monthly_tokens"`, `"tier_crossed"`, `"exhaustion_predicted"`, `"a b"`, `"A-Z.a_z:0-9"`, `"é"`, `"\u00e9"`,
	`"\ud800"`, `"*"`, `"1.0"`, `"dev.sluice.usage.v1"`, `"application/json"`, `"//gw/x"`, `"%zz"`,
	q(strings.Repeat("a", 64)), q(strings.Repeat("a", 65)), q(strings.Repeat("a", 128)),
	q(strings.Repeat("a", 129)), q(strings.Repeat("a", 256)), q(strings.Repeat("a", 257)),
	`"2024-05-01T12:00:00Z"`, `"2024-05-01T12:00:00.5+01:00"`, `"2024-05-01"`, `"1969-12-31T23:59:59Z"`,
	`"9999-12-31T23:59:59Z"`, `"2024-02-30T00:00:00Z"`, `"2024-05-01T12:00:00z"`,
	`0`, `-0`, `1`, `-1`, `69`, `70`, `90`, `99`, `100`, `599`, `600`, `1000`, `1001`, `1200`, `1201`,
	`3600000`, `3600001`, `1000000000`, `1000000001`, `1.5`, `2.0`, `1e3`, `-1e2`,
	`2147483648`, `9223372036854775807`, `9223372036854775808`, `1e30`,
	`true`, `false`, `{}`, `[]`, `["a"]`, `{"a":"b"}`, `{"a":1}`, `{"a b":"c"}`,
	`{"partition":1,"from_offset":2,"to_offset":3}`, `{"partition":-1}`, `{"to_offset":-1}`,
	payload,
}

var tenantRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// jsonInt returns the integer value of a JSON number literal, if it is one.
func jsonInt(v string) (int64, bool) {
	if v == "" || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return 0, false
	}
	n, reason := parseInt(v, 0, "")
	return n, reason == ""
}

// TestJSONSchemaAgreementMutations puts every value of mutationValues into
// every field of a valid document and checks that the Go decoders and the
// JSON Schemas agree, apart from the known differences each suite lists.
func TestJSONSchemaAgreementMutations(t *testing.T) {
	usage, signal, ceUsage := loadSchemas(t)
	freeText := func(v string) bool { return v == `"\ud800"` } // lone surrogates: Go only
	suites := []struct {
		name   string
		fields []string
		build  func(field, value string) string
		schema *jsonschema.Schema
		decode func([]byte) error
		goOnly func(field, value string) bool
	}{
		{
			name:   "usage",
			fields: append(append([]string{}, usageFieldNames[:]...), "x", "Tenant"),
			build:  func(f, v string) string { return ev(f, v) },
			schema: usage,
			decode: func(b []byte) error { var e UsageEvent; return DecodeUsageEvent(b, &e) },
			goOnly: func(f, v string) bool {
				switch f {
				case "cached_tokens":
					n, ok := jsonInt(v)
					return ok && n > 1200 && n <= MaxTokensPerEvent
				case "user", "api_key_id", "provider", "endpoint", "session_id", "gateway":
					return freeText(v)
				}
				return false
			},
		},
		{
			name: "cloudevent",
			fields: []string{"specversion", "type", "source", "id", "time", "subject", "datacontenttype",
				"dataschema", "data", "data_base64", "ext1", "Ext"},
			build: func(f, v string) string {
				if f == "data" {
					return ceDoc(v)
				}
				return ceDoc(payload, f, v)
			},
			schema: ceUsage,
			decode: func(b []byte) error { var e UsageEvent; return DecodeCloudEvent(b, &e) },
			goOnly: func(f, v string) bool {
				switch f {
				case "subject":
					s, err := strconv.Unquote(v)
					return err == nil && tenantRE.MatchString(s) && s != "acme"
				case "source", "dataschema": // extension values are ignored, surrogates too
					return freeText(v)
				}
				return false
			},
		},
		{
			name: "signal",
			fields: []string{"id", "kind", "time", "tenant", "model", "quota", "period", "period_start", "period_end",
				"tier", "previous_tier", "direction", "used", "limit", "unit", "rate", "predicted_exhaustion", "mode",
				"reason", "source", "attributes", "future"},
			build:  func(f, v string) string { return sig(f, v) },
			schema: signal,
			decode: func(b []byte) error { var s Signal; return DecodeSignal(b, &s) },
			goOnly: func(f, v string) bool {
				n, isInt := jsonInt(v)
				switch f {
				case "tier": // the base signal crossed up from 70; null is 0
					return isInt && n >= 0 && n <= 70 || v == "null"
				case "previous_tier": // ... to 90
					return isInt && n >= 90 && n <= MaxTier
				case "direction":
					return v == `"down"`
				case "reason":
					return freeText(v)
				}
				return false
			},
		},
	}
	for _, s := range suites {
		cases := 0
		for _, f := range s.fields {
			for _, v := range mutationValues {
				doc := s.build(f, v)
				cases++
				goErr := s.decode([]byte(doc))
				schemaErr := schemaAccepts(s.schema, []byte(doc))
				if s.goOnly(f, v) {
					if goErr == nil || schemaErr != nil {
						t.Errorf("%s %s=%s: expected only Go to reject: go=%v schema=%v", s.name, f, v, goErr, schemaErr)
					}
					continue
				}
				if (goErr == nil) != (schemaErr == nil) {
					t.Errorf("%s %s=%.60s: go=%v\nschema=%v\n%s", s.name, f, v, goErr, schemaErr, doc)
				}
			}
		}
		t.Logf("%s: %d mutated documents", s.name, cases)
	}
}
