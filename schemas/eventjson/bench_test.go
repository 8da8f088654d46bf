package eventjson

import (
	"encoding/json"
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// BenchmarkDecodeValidate measures DecodeUsageEvent, which validates, on a
// typical event: the required fields plus outcome, latency_ms, status and
// api_key_id. The target is at most 1 µs and 2 allocations per event.
func BenchmarkDecodeValidate(b *testing.B) { benchDecode(b, "event-typical.json") }

// BenchmarkDecodeValidateFull is the same with every field and three
// attributes, to show what attributes cost.
func BenchmarkDecodeValidateFull(b *testing.B) { benchDecode(b, "event-full.json") }

// benchDecode measures DecodeUsageEvent on the testdata file name.
func benchDecode(b *testing.B, name string) {
	data := schematest.ReadTestdata(b, name)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var ev schemas.UsageEvent
	for b.Loop() {
		if err := DecodeUsageEvent(data, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeValidateEncodingJSON is BenchmarkDecodeValidate done with
// encoding/json and Validate: the reference that justifies a hand-written
// decoder, which must stay well ahead of it. encoding/json is also more
// lenient (case-insensitive keys, last duplicate wins), so it is not a
// drop-in replacement either way.
func BenchmarkDecodeValidateEncodingJSON(b *testing.B) {
	data := schematest.ReadTestdata(b, "event-typical.json")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var ev schemas.UsageEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			b.Fatal(err)
		}
		if err := ev.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeCloudEvent measures a structured CloudEvent with a typical
// payload.
func BenchmarkDecodeCloudEvent(b *testing.B) {
	ev := typicalEvent(b)
	data := AppendCloudEventJSON(nil, "//gateway.example.com/eu-1", &ev)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeCloudEvent(data, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendUsageEventJSON(b *testing.B) {
	ev := typicalEvent(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendUsageEventJSON(buf[:0], &ev)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkSplitDecode1000 frames and decodes a batch of 1000 typical
// events, which is what ingest does per request; ns/op is per batch.
func BenchmarkSplitDecode1000(b *testing.B) {
	data := schematest.TypicalBatch(b, 1000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var ev schemas.UsageEvent
	for b.Loop() {
		if err := framing.SplitJSONArray(data, func(_ int, raw []byte) error { return DecodeUsageEvent(raw, &ev) }); err != nil {
			b.Fatal(err)
		}
	}
}

func typicalEvent(tb testing.TB) schemas.UsageEvent {
	var ev schemas.UsageEvent
	if err := DecodeUsageEvent(schematest.ReadTestdata(tb, "event-typical.json"), &ev); err != nil {
		tb.Fatal(err)
	}
	return ev
}

// BenchmarkBatchDecodeJSONArray1000 is BenchmarkSplitDecode1000 with a
// BatchDecoder: one pass, one shared copy of the body, recycled maps.
// ns/op is per batch.
func BenchmarkBatchDecodeJSONArray1000(b *testing.B) {
	data := schematest.TypicalBatch(b, 1000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var d BatchDecoder
	evs := make([]schemas.UsageEvent, 1000)
	for b.Loop() {
		d.Reset(data)
		err := d.DecodeJSONArray(false, func(i int, decode func(*schemas.UsageEvent) error) error {
			d.Recycle(evs[i].Attributes)
			return decode(&evs[i])
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
