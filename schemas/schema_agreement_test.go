package schemas_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/scalar"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func TestJSONSchemaFiles(t *testing.T) {
	schematest.LoadSchemas(t)
	entries, err := fs.ReadDir(schemas.JSONSchemaFS, "jsonschema")
	if err != nil || len(entries) != 4 {
		t.Fatalf("embedded schemas: %v, %v", entries, err)
	}
	for _, e := range entries {
		b, _ := schemas.JSONSchema(e.Name())
		var doc struct {
			ID     string `json:"$id"`
			Schema string `json:"$schema"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		if doc.ID != schematest.SchemaBase+e.Name() || doc.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $id %q, $schema %q", e.Name(), doc.ID, doc.Schema)
		}
	}
	if _, err := schemas.JSONSchema("nope.json"); err == nil {
		t.Error("unknown schema name accepted")
	}
	// The time pattern in the schemas is the one the decoder documents.
	b, _ := schemas.JSONSchema(schemas.JSONSchemaUsageEventV1)
	if !bytes.Contains(b, []byte(strings.ReplaceAll(scalar.TimePattern, `\`, `\\`))) {
		t.Error("usage-event.v1.json does not carry timePattern")
	}
}

// TestJSONSchemaAgreement holds DecodeSignal and the signal JSON Schema to
// the same verdicts on the signal corpus; schemas/eventjson does the same
// for usage events and CloudEvents.
func TestJSONSchemaAgreement(t *testing.T) {
	_, signal, _ := schematest.LoadSchemas(t)
	schematest.Agree(t, schematest.SignalCorpus, signal, func(b []byte) error { var s schemas.Signal; return schemas.DecodeSignal(b, &s) })
}

// TestJSONSchemaTestdata checks every example file against its schema.
func TestJSONSchemaTestdata(t *testing.T) {
	usage, signal, ceUsage := schematest.LoadSchemas(t)
	for name, sch := range map[string]*jsonschema.Schema{
		"event-minimal.json": usage, "event-typical.json": usage, "event-full.json": usage,
		"cloudevent.json": ceUsage, "signal-tier-crossed.json": signal, "signal-exhaustion-predicted.json": signal,
	} {
		if err := schematest.SchemaAccepts(sch, schematest.ReadTestdata(t, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"batch.json", "cloudevents-batch.json"} {
		sch := usage
		if strings.HasPrefix(name, "cloud") {
			sch = ceUsage
		}
		err := framing.SplitJSONArray(schematest.ReadTestdata(t, name), func(_ int, raw []byte) error { return schematest.SchemaAccepts(sch, raw) })
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
