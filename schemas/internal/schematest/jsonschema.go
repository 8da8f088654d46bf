package schematest

import (
	"bytes"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluicehq/sluice/schemas"
)

// SchemaBase is the prefix of the $id of every embedded schema.
const SchemaBase = "https://github.com/sluicehq/sluice/schemas/jsonschema/"

var compiledSchemas struct {
	once                   sync.Once
	usage, signal, ceUsage *jsonschema.Schema
	err                    error
}

// LoadSchemas compiles the embedded schemas once per test binary, asserting
// formats (date-time, uri-reference), which draft 2020-12 otherwise treats
// as annotations.
func LoadSchemas(tb testing.TB) (usage, signal, ceUsage *jsonschema.Schema) {
	tb.Helper()
	cs := &compiledSchemas
	cs.once.Do(func() {
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		for _, name := range []string{schemas.JSONSchemaUsageEventV1, schemas.JSONSchemaSignalV1, schemas.JSONSchemaCloudEventUsageV1} {
			b, err := schemas.JSONSchema(name)
			if err != nil {
				cs.err = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				cs.err = err
				return
			}
			if err := c.AddResource(SchemaBase+name, doc); err != nil {
				cs.err = err
				return
			}
		}
		if cs.usage, cs.err = c.Compile(SchemaBase + schemas.JSONSchemaUsageEventV1); cs.err != nil {
			return
		}
		if cs.signal, cs.err = c.Compile(SchemaBase + schemas.JSONSchemaSignalV1); cs.err != nil {
			return
		}
		cs.ceUsage, cs.err = c.Compile(SchemaBase + schemas.JSONSchemaCloudEventUsageV1)
	})
	if cs.err != nil {
		tb.Fatal(cs.err)
	}
	return cs.usage, cs.signal, cs.ceUsage
}

// SchemaAccepts validates doc against sch and returns why it fails.
func SchemaAccepts(sch *jsonschema.Schema, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}
