package eventjson

import (
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func decodeUsage(b []byte) error { var e schemas.UsageEvent; return DecodeUsageEvent(b, &e) }

func decodeCloud(b []byte) error { var e schemas.UsageEvent; return DecodeCloudEvent(b, &e) }

// TestJSONSchemaAgreement holds the decoders and the JSON Schemas to the
// same verdicts on the usage event and CloudEvent corpora.
func TestJSONSchemaAgreement(t *testing.T) {
	usage, _, ceUsage := schematest.LoadSchemas(t)
	t.Run("usage", func(t *testing.T) { schematest.Agree(t, schematest.UsageCorpus, usage, decodeUsage) })
	t.Run("cloudevent", func(t *testing.T) { schematest.Agree(t, schematest.CloudEventCorpus, ceUsage, decodeCloud) })
}

// TestJSONSchemaAgreementMutations puts every mutation value into every
// field of a valid document and checks that the decoders and the JSON
// Schemas agree, apart from the known differences each suite lists.
func TestJSONSchemaAgreementMutations(t *testing.T) {
	usage, _, ceUsage := schematest.LoadSchemas(t)
	t.Run("usage", func(t *testing.T) {
		fields := []string{"x", "Tenant"}
		for f := schemas.FieldID; f <= schemas.FieldAttributes; f <<= 1 {
			fields = append(fields, f.Name())
		}
		schematest.Mutations(t, fields, func(f, v string) string { return schematest.Ev(f, v) }, usage, decodeUsage,
			func(f, v string) bool {
				switch f {
				case "cached_tokens":
					n, ok := schematest.JSONInt(v)
					return ok && n > 1200 && n <= schemas.MaxTokensPerEvent
				case "user", "api_key_id", "provider", "endpoint", "session_id", "gateway":
					return v == schematest.LoneSurrogate
				}
				return false
			})
	})
	t.Run("cloudevent", func(t *testing.T) {
		fields := []string{"specversion", "type", "source", "id", "time", "subject", "datacontenttype",
			"dataschema", "data", "data_base64", "ext1", "Ext"}
		build := func(f, v string) string {
			if f == "data" {
				return schematest.CEDoc(v)
			}
			return schematest.CEDoc(schematest.Payload, f, v)
		}
		schematest.Mutations(t, fields, build, ceUsage, decodeCloud, func(f, v string) bool {
			switch f {
			case "subject":
				s, err := strconv.Unquote(v)
				return err == nil && schematest.TenantRE.MatchString(s) && s != "acme"
			case "source", "dataschema": // extension values are ignored, surrogates too
				return v == schematest.LoneSurrogate
			}
			return false
		})
	})
}
