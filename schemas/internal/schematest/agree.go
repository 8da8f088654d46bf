package schematest

import (
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// Agree holds a Go decoder and a JSON Schema to the same verdicts on the
// documents of corpus, which must have at least 40 cases.
func Agree(t *testing.T, corpus []Case, sch *jsonschema.Schema, decode func([]byte) error) {
	t.Helper()
	if len(corpus) < 40 {
		t.Errorf("corpus has %d cases; keep at least 40", len(corpus))
	}
	for _, tc := range corpus {
		t.Run(tc.Name, func(t *testing.T) {
			goErr := decode([]byte(tc.Doc))
			schemaErr := SchemaAccepts(sch, []byte(tc.Doc))
			switch {
			case tc.GoOnly != "":
				if goErr == nil || schemaErr != nil {
					t.Errorf("known difference (%s) no longer holds: go=%v schema=%v\n%s", tc.GoOnly, goErr, schemaErr, tc.Doc)
				}
			case tc.Valid:
				if goErr != nil || schemaErr != nil {
					t.Errorf("want accepted: go=%v schema=%v\n%s", goErr, schemaErr, tc.Doc)
				}
			default:
				if goErr == nil || schemaErr == nil {
					t.Errorf("want rejected: go=%v schema=%v\n%s", goErr, schemaErr, tc.Doc)
				}
			}
		})
	}
}

// Mutations puts every value of MutationValues into every one of fields in
// turn, builds a document with build, and checks that decode and the JSON
// Schema sch agree, except where goOnly says that only Go rejects.
func Mutations(t *testing.T, fields []string, build func(field, value string) string, sch *jsonschema.Schema,
	decode func([]byte) error, goOnly func(field, value string) bool) {
	t.Helper()
	cases := 0
	for _, f := range fields {
		for _, v := range MutationValues {
			doc := build(f, v)
			cases++
			goErr := decode([]byte(doc))
			schemaErr := SchemaAccepts(sch, []byte(doc))
			if goOnly(f, v) {
				if goErr == nil || schemaErr != nil {
					t.Errorf("%s=%s: expected only Go to reject: go=%v schema=%v", f, v, goErr, schemaErr)
				}
				continue
			}
			if (goErr == nil) != (schemaErr == nil) {
				t.Errorf("%s=%.60s: go=%v\nschema=%v\n%s", f, v, goErr, schemaErr, doc)
			}
		}
	}
	t.Logf("%d mutated documents", cases)
}

// MutationValues is a pool of JSON values that the mutation tests put into
// every field in turn: each type, each boundary of each limit, and the
// usual ways of getting a timestamp or an enum wrong.
var MutationValues = []string{
	`null`, `""`, `"x"`, `"acme"`, `"ok"`, `"high"`, `"up"`, `"down"`, `"tokens"`, `"hard"`, `"month"`,
	`"monthly_tokens"`, `"tier_crossed"`, `"exhaustion_predicted"`, `"a b"`, `"A-Z.a_z:0-9"`, `"é"`, `"\u00e9"`,
	`"\ud800"`, `"*"`, `"1.0"`, `"dev.sluice.usage.v1"`, `"application/json"`, `"//gw/x"`, `"%zz"`,
	Q(strings.Repeat("a", 64)), Q(strings.Repeat("a", 65)), Q(strings.Repeat("a", 128)),
	Q(strings.Repeat("a", 129)), Q(strings.Repeat("a", 256)), Q(strings.Repeat("a", 257)),
	`"2024-05-01T12:00:00Z"`, `"2024-05-01T12:00:00.5+01:00"`, `"2024-05-01"`, `"1969-12-31T23:59:59Z"`,
	`"9999-12-31T23:59:59Z"`, `"2024-02-30T00:00:00Z"`, `"2024-05-01T12:00:00z"`,
	`0`, `-0`, `1`, `-1`, `69`, `70`, `90`, `99`, `100`, `599`, `600`, `1000`, `1001`, `1200`, `1201`,
	`3600000`, `3600001`, `1000000000`, `1000000001`, `1.5`, `2.0`, `1e3`, `-1e2`,
	`2147483648`, `9223372036854775807`, `9223372036854775808`, `1e30`,
	`true`, `false`, `{}`, `[]`, `["a"]`, `{"a":"b"}`, `{"a":1}`, `{"a b":"c"}`,
	`{"partition":1,"from_offset":2,"to_offset":3}`, `{"partition":-1}`, `{"to_offset":-1}`,
	Payload,
}

// LoneSurrogate is the mutation value that only Go rejects in free text:
// JSON Schema has no rule for valid Unicode.
const LoneSurrogate = `"\ud800"`

// TenantRE is the tenant rule as a regular expression.
var TenantRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// JSONInt returns the integer value of a JSON number literal, if it is one.
func JSONInt(v string) (int64, bool) {
	if v == "" || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return 0, false
	}
	n, reason := scalar.ParseInt(v, 0, "")
	return n, reason == ""
}
