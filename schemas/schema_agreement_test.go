package schemas

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const schemaBase = "https://github.com/sluicehq/sluice/schemas/jsonschema/"

var compiledSchemas struct {
	once                   sync.Once
	usage, signal, ceUsage *jsonschema.Schema
	err                    error
}

// loadSchemas compiles the embedded schemas, asserting formats (date-time,
// uri-reference), which draft 2020-12 otherwise treats as annotations.
func loadSchemas(tb testing.TB) (usage, signal, ceUsage *jsonschema.Schema) {
	tb.Helper()
	cs := &compiledSchemas
	cs.once.Do(func() {
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		for _, name := range []string{JSONSchemaUsageEventV1, JSONSchemaSignalV1, JSONSchemaCloudEventUsageV1} {
			b, err := JSONSchema(name)
			if err != nil {
				cs.err = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				cs.err = err
				return
			}
			if err := c.AddResource(schemaBase+name, doc); err != nil {
				cs.err = err
				return
			}
		}
		if cs.usage, cs.err = c.Compile(schemaBase + JSONSchemaUsageEventV1); cs.err != nil {
			return
		}
		if cs.signal, cs.err = c.Compile(schemaBase + JSONSchemaSignalV1); cs.err != nil {
			return
		}
		cs.ceUsage, cs.err = c.Compile(schemaBase + JSONSchemaCloudEventUsageV1)
	})
	if cs.err != nil {
		tb.Fatal(cs.err)
	}
	return cs.usage, cs.signal, cs.ceUsage
}

// schemaAccepts validates doc against sch.
func schemaAccepts(sch *jsonschema.Schema, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}

func TestJSONSchemaFiles(t *testing.T) {
	loadSchemas(t)
	entries, err := fs.ReadDir(JSONSchemaFS, "jsonschema")
	if err != nil || len(entries) != 3 {
		t.Fatalf("embedded schemas: %v, %v", entries, err)
	}
	for _, e := range entries {
		b, _ := JSONSchema(e.Name())
		var doc struct {
			ID     string `json:"$id"`
			Schema string `json:"$schema"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		if doc.ID != schemaBase+e.Name() || doc.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $id %q, $schema %q", e.Name(), doc.ID, doc.Schema)
		}
	}
	if _, err := JSONSchema("nope.json"); err == nil {
		t.Error("unknown schema name accepted")
	}
	// The time pattern in the schemas is the one the decoder documents.
	b, _ := JSONSchema(JSONSchemaUsageEventV1)
	if !bytes.Contains(b, []byte(strings.ReplaceAll(timePattern, `\`, `\\`))) {
		t.Error("usage-event.v1.json does not carry timePattern")
	}
}

// TestJSONSchemaAgreement holds the Go decoders and the JSON Schemas to the
// same verdicts on the corpora.
func TestJSONSchemaAgreement(t *testing.T) {
	usage, signal, ceUsage := loadSchemas(t)
	suites := []struct {
		name   string
		corpus []corpusCase
		schema *jsonschema.Schema
		decode func([]byte) error
	}{
		{"usage", usageCorpus, usage, func(b []byte) error { var e UsageEvent; return DecodeUsageEvent(b, &e) }},
		{"cloudevent", cloudEventCorpus, ceUsage, func(b []byte) error { var e UsageEvent; return DecodeCloudEvent(b, &e) }},
		{"signal", signalCorpus, signal, func(b []byte) error { var s Signal; return DecodeSignal(b, &s) }},
	}
	for _, s := range suites {
		if len(s.corpus) < 40 {
			t.Errorf("%s corpus has %d cases; keep at least 40", s.name, len(s.corpus))
		}
		for _, tc := range s.corpus {
			t.Run(s.name+"/"+tc.name, func(t *testing.T) {
				goErr := s.decode([]byte(tc.doc))
				schemaErr := schemaAccepts(s.schema, []byte(tc.doc))
				switch {
				case tc.goOnly != "":
					if goErr == nil || schemaErr != nil {
						t.Errorf("known difference (%s) no longer holds: go=%v schema=%v\n%s", tc.goOnly, goErr, schemaErr, tc.doc)
					}
				case tc.valid:
					if goErr != nil || schemaErr != nil {
						t.Errorf("want accepted: go=%v schema=%v\n%s", goErr, schemaErr, tc.doc)
					}
				default:
					if goErr == nil || schemaErr == nil {
						t.Errorf("want rejected: go=%v schema=%v\n%s", goErr, schemaErr, tc.doc)
					}
				}
			})
		}
	}
}

// TestJSONSchemaTestdata checks every example file against its schema.
func TestJSONSchemaTestdata(t *testing.T) {
	usage, signal, ceUsage := loadSchemas(t)
	for name, sch := range map[string]*jsonschema.Schema{
		"event-minimal.json": usage, "event-typical.json": usage, "event-full.json": usage,
		"cloudevent.json": ceUsage, "signal-tier-crossed.json": signal, "signal-exhaustion-predicted.json": signal,
	} {
		if err := schemaAccepts(sch, readTestdata(t, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"batch.json", "cloudevents-batch.json"} {
		sch := usage
		if strings.HasPrefix(name, "cloud") {
			sch = ceUsage
		}
		err := SplitJSONArray(readTestdata(t, name), func(_ int, raw []byte) error { return schemaAccepts(sch, raw) })
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
