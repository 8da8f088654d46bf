package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// checkDecodeError fails unless err is one of the documented error types,
// with every problem naming a field and a reason.
func checkDecodeError(t *testing.T, err error) {
	t.Helper()
	var se *SyntaxError
	var ve ValidationError
	switch {
	case errors.As(err, &se):
		if se.Msg == "" || se.Offset < 0 {
			t.Fatalf("bad SyntaxError %+v", se)
		}
	case errors.As(err, &ve):
		if len(ve) == 0 {
			t.Fatal("empty ValidationError")
		}
		for _, fe := range ve {
			if fe.Field == "" || fe.Reason == "" {
				t.Fatalf("FieldError without field or reason: %+v", fe)
			}
		}
	default:
		t.Fatalf("unexpected error type %T: %v", err, err)
	}
}

func FuzzDecodeUsageEvent(f *testing.F) {
	for _, tc := range usageCorpus {
		f.Add([]byte(tc.doc))
	}
	for _, name := range []string{"event-minimal.json", "event-typical.json", "event-full.json"} {
		f.Add(readTestdata(f, name))
	}
	usage, _, _ := loadSchemas(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev UsageEvent
		err := DecodeUsageEvent(data, &ev)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("decoded event fails Validate: %v\n%q", err, data)
		}
		out := AppendUsageEventJSON(nil, &ev)
		var back UsageEvent
		if err := DecodeUsageEvent(out, &back); err != nil {
			t.Fatalf("re-encoded event does not decode: %v\nin  %q\nout %s", err, data, out)
		}
		if !equalEvents(&ev, &back) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", ev, back)
		}
		if err := schemaAccepts(usage, data); err != nil {
			t.Fatalf("decoder accepted what the JSON Schema rejects: %v\n%q", err, data)
		}
		if err := schemaAccepts(usage, out); err != nil {
			t.Fatalf("JSON Schema rejects the canonical encoding: %v\n%s", err, out)
		}
	})
}

func FuzzDecodeCloudEvent(f *testing.F) {
	for _, tc := range cloudEventCorpus {
		f.Add([]byte(tc.doc))
	}
	f.Add(readTestdata(f, "cloudevent.json"))
	_, _, ceUsage := loadSchemas(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev UsageEvent
		err := DecodeCloudEvent(data, &ev)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("decoded event fails Validate: %v\n%q", err, data)
		}
		if err := schemaAccepts(ceUsage, data); err != nil {
			t.Fatalf("decoder accepted what the JSON Schema rejects: %v\n%q", err, data)
		}
		out := AppendCloudEventJSON(nil, "//fuzz", &ev)
		var back UsageEvent
		if err := DecodeCloudEvent(out, &back); err != nil || !equalEvents(&ev, &back) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, ev, back)
		}
	})
}

func FuzzDecodeSignal(f *testing.F) {
	for _, tc := range signalCorpus {
		f.Add([]byte(tc.doc))
	}
	_, signal, _ := loadSchemas(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var s Signal
		err := DecodeSignal(data, &s)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		if err := schemaAccepts(signal, data); err != nil {
			t.Fatalf("decoder accepted what the JSON Schema rejects: %v\n%q", err, data)
		}
		out, err := EncodeSignal(&s)
		if err != nil {
			t.Fatalf("EncodeSignal rejects a decoded signal: %v", err)
		}
		var back Signal
		if err := DecodeSignal(out, &back); err != nil {
			t.Fatalf("re-encoded signal does not decode: %v\n%s", err, out)
		}
	})
}

func FuzzSplitJSONArray(f *testing.F) {
	f.Add([]byte(`[]`))
	f.Add([]byte(`[1,"a",{"b":[1,{"c":"]}\""}]},null]`))
	f.Add(readTestdata(f, "batch.json"))
	f.Add(readTestdata(f, "cloudevents-batch.json"))
	f.Add([]byte(`[{"a":"\\"},[[]],"\u005d"]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var elems [][]byte
		err := SplitJSONArray(data, func(i int, elem []byte) error {
			if i != len(elems) {
				t.Fatalf("index %d, want %d", i, len(elems))
			}
			elems = append(elems, elem)
			return nil
		})
		if err != nil {
			var se *SyntaxError
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
	f.Add(readTestdata(f, "batch.ndjson"))
	f.Add([]byte("\r\n\n {} \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = SplitNDJSON(data, func(_ int, line []byte) error {
			if len(line) == 0 || bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("bad line %q", line)
			}
			return nil
		})
	})
}
