package schemas_test

import (
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// FuzzDecodeSignal checks that DecodeSignal agrees with the reference
// walker (encoding/json's Decoder under the same judges), that what it
// accepts the JSON Schema accepts, and that what it accepts encodes and
// decodes again.
func FuzzDecodeSignal(f *testing.F) {
	for _, tc := range schematest.SignalCorpus {
		f.Add([]byte(tc.Doc))
	}
	_, signal, _ := schematest.LoadSchemas(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstReference(t, data)
		var s schemas.Signal
		err := schemas.DecodeSignal(data, &s)
		if err != nil {
			schematest.CheckDecodeError(t, err)
			return
		}
		if err := schematest.SchemaAccepts(signal, data); err != nil {
			t.Fatalf("decoder accepted what the JSON Schema rejects: %v\n%q", err, data)
		}
		out, err := schemas.EncodeSignal(&s)
		if err != nil {
			t.Fatalf("EncodeSignal rejects a decoded signal: %v", err)
		}
		var back schemas.Signal
		if err := schemas.DecodeSignal(out, &back); err != nil {
			t.Fatalf("re-encoded signal does not decode: %v\n%s", err, out)
		}
	})
}
