package framing_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func FuzzSplitJSONArray(f *testing.F) {
	f.Add([]byte(`[]`))
	f.Add([]byte(`[1,"a",{"b":[1,{"c":"]}\""}]},null]`))
	f.Add(schematest.ReadTestdata(f, "batch.json"))
	f.Add(schematest.ReadTestdata(f, "cloudevents-batch.json"))
	f.Add([]byte(`[{"a":"\\"},[[]],"\u005d"]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var elems [][]byte
		err := framing.SplitJSONArray(data, func(i int, elem []byte) error {
			if i != len(elems) {
				t.Fatalf("index %d, want %d", i, len(elems))
			}
			elems = append(elems, elem)
			return nil
		})
		if err != nil {
			var se *schemas.SyntaxError
			if !errors.As(err, &se) || se.Offset < 0 || se.Offset > int64(len(data)) {
				t.Fatalf("bad error %T %v", err, err)
			}
		}
		// On valid JSON arrays the framing must match encoding/json's.
		var want []json.RawMessage
		trimmed := bytes.TrimLeft(data, " \t\r\n")
		if len(trimmed) == 0 || trimmed[0] != '[' || !json.Valid(data) || json.Unmarshal(data, &want) != nil {
			return
		}
		if err != nil {
			t.Fatalf("valid array rejected: %v\n%q", err, data)
		}
		if len(elems) != len(want) {
			t.Fatalf("%d elements, encoding/json finds %d\n%q", len(elems), len(want), data)
		}
		for i := range want {
			if !bytes.Equal(elems[i], bytes.TrimSpace(want[i])) {
				t.Fatalf("element %d is %q, encoding/json says %q", i, elems[i], want[i])
			}
		}
	})
}

func FuzzSplitNDJSON(f *testing.F) {
	f.Add(schematest.ReadTestdata(f, "batch.ndjson"))
	f.Add([]byte("\r\n\n {} \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = framing.SplitNDJSON(data, func(_ int, line []byte) error {
			if len(line) == 0 || bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("bad line %q", line)
			}
			return nil
		})
	})
}
