package eventjson

import (
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func FuzzDecodeUsageEvent(f *testing.F) {
	for _, tc := range schematest.UsageCorpus {
		f.Add([]byte(tc.Doc))
	}
	for _, name := range []string{"event-minimal.json", "event-typical.json", "event-full.json"} {
		f.Add(schematest.ReadTestdata(f, name))
	}
	usage, _, _ := schematest.LoadSchemas(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev schemas.UsageEvent
		err := DecodeUsageEvent(data, &ev)
		if err != nil {
			schematest.CheckDecodeError(t, err)
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("decoded event fails Validate: %v\n%q", err, data)
		}
		out := AppendUsageEventJSON(nil, &ev)
		var back schemas.UsageEvent
		if err := DecodeUsageEvent(out, &back); err != nil {
			t.Fatalf("re-encoded event does not decode: %v\nin  %q\nout %s", err, data, out)
		}
		if !schematest.EqualEvents(&ev, &back) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", ev, back)
		}
		if err := schematest.SchemaAccepts(usage, data); err != nil {
			t.Fatalf("decoder accepted what the JSON Schema rejects: %v\n%q", err, data)
		}
		if err := schematest.SchemaAccepts(usage, out); err != nil {
			t.Fatalf("JSON Schema rejects the canonical encoding: %v\n%s", err, out)
		}
	})
}

func FuzzDecodeCloudEvent(f *testing.F) {
	for _, tc := range schematest.CloudEventCorpus {
		f.Add([]byte(tc.Doc))
	}
	f.Add(schematest.ReadTestdata(f, "cloudevent.json"))
	_, _, ceUsage := schematest.LoadSchemas(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev schemas.UsageEvent
		err := DecodeCloudEvent(data, &ev)
		if err != nil {
			schematest.CheckDecodeError(t, err)
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("decoded event fails Validate: %v\n%q", err, data)
		}
		if err := schematest.SchemaAccepts(ceUsage, data); err != nil {
			t.Fatalf("decoder accepted what the JSON Schema rejects: %v\n%q", err, data)
		}
		out := AppendCloudEventJSON(nil, "//fuzz", &ev)
		var back schemas.UsageEvent
		if err := DecodeCloudEvent(out, &back); err != nil || !schematest.EqualEvents(&ev, &back) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, ev, back)
		}
	})
}
