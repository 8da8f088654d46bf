package framing_test

import (
	"testing"

	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// BenchmarkSplitJSONArray1000 frames a batch of 1000 typical events, the
// largest body ingest expects from one gateway request; ns/op is per batch.
func BenchmarkSplitJSONArray1000(b *testing.B) {
	data := schematest.TypicalBatch(b, 1000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if err := framing.SplitJSONArray(data, func(int, []byte) error { n++; return nil }); err != nil || n != 1000 {
			b.Fatal(err, n)
		}
	}
}
