package schemas_test

import (
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// TestJSONSchemaAgreementMutations puts every mutation value into every
// field of a valid signal and checks that DecodeSignal and the JSON Schema
// agree, apart from the known differences.
func TestJSONSchemaAgreementMutations(t *testing.T) {
	_, signal, _ := schematest.LoadSchemas(t)
	fields := []string{"id", "kind", "time", "tenant", "model", "quota", "period", "period_start", "period_end",
		"tier", "previous_tier", "direction", "used", "limit", "unit", "rate", "predicted_exhaustion", "mode",
		"reason", "source", "attributes", "future"}
	schematest.Mutations(t, fields, func(f, v string) string { return schematest.Sig(f, v) }, signal,
		func(b []byte) error { var s schemas.Signal; return schemas.DecodeSignal(b, &s) },
		func(f, v string) bool {
			n, isInt := schematest.JSONInt(v)
			switch f {
			case "tier": // the base signal crossed up from 70; null is 0
				return isInt && n >= 0 && n <= 70 || v == "null"
			case "previous_tier": // ... to 90
				return isInt && n >= 90 && n <= schemas.MaxTier
			case "direction":
				return v == `"down"`
			case "reason":
				return v == schematest.LoneSurrogate
			}
			return false
		})
}
