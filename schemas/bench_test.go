package schemas

import (
	"bytes"
	"testing"
)

// BenchmarkDecodeValidate measures DecodeUsageEvent, which validates, on a
// typical event: the required fields plus outcome, latency_ms, status and
// api_key_id. The target is at most 1 µs and 2 allocations per event.
func BenchmarkDecodeValidate(b *testing.B) {
	data := readTestdata(b, "event-typical.json")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var ev UsageEvent
	for b.Loop() {
		if err := DecodeUsageEvent(data, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeValidateFull is the same with every field and three
// attributes, to show what attributes cost.
func BenchmarkDecodeValidateFull(b *testing.B) {
	data := readTestdata(b, "event-full.json")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var ev UsageEvent
	for b.Loop() {
		if err := DecodeUsageEvent(data, &ev); err != nil {
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

// BenchmarkSplitJSONArray1000 frames a batch of 1000 typical events; ns/op
// is per batch.
func BenchmarkSplitJSONArray1000(b *testing.B) {
	data := typicalBatch(b, 1000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if err := SplitJSONArray(data, func(int, []byte) error { n++; return nil }); err != nil || n != 1000 {
			b.Fatal(err, n)
		}
	}
}

// BenchmarkSplitDecode1000 frames and decodes a batch of 1000 typical
// events, which is what ingest does per request; ns/op is per batch.
func BenchmarkSplitDecode1000(b *testing.B) {
	data := typicalBatch(b, 1000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var ev UsageEvent
	for b.Loop() {
		if err := SplitJSONArray(data, func(_ int, raw []byte) error { return DecodeUsageEvent(raw, &ev) }); err != nil {
			b.Fatal(err)
		}
	}
}

func typicalEvent(tb testing.TB) UsageEvent {
	var ev UsageEvent
	if err := DecodeUsageEvent(readTestdata(tb, "event-typical.json"), &ev); err != nil {
		tb.Fatal(err)
	}
	return ev
}

func typicalBatch(tb testing.TB, n int) []byte {
	one := bytes.TrimSpace(readTestdata(tb, "event-typical.json"))
	var buf bytes.Buffer
	buf.WriteString("[\n")
	for i := range n {
		if i > 0 {
			buf.WriteString(",\n")
		}
		buf.Write(one)
	}
	buf.WriteString("\n]")
	return buf.Bytes()
}

// BenchmarkBatchDecodeJSONArray1000 is BenchmarkSplitDecode1000 with a
// BatchDecoder: one pass, one shared copy of the body, recycled maps.
// ns/op is per batch.
func BenchmarkBatchDecodeJSONArray1000(b *testing.B) {
	data := typicalBatch(b, 1000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var d BatchDecoder
	evs := make([]UsageEvent, 1000)
	for b.Loop() {
		d.Reset(data)
		err := d.DecodeJSONArray(false, func(i int, decode func(*UsageEvent) error) error {
			d.Recycle(evs[i].Attributes)
			return decode(&evs[i])
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
