package schemas_test

import (
	"testing"

	"github.com/sluicehq/sluice/schemas"
)

// BenchmarkEncodeSignal measures EncodeSignal, validation included, on a
// tier_crossed signal with every common field set.
func BenchmarkEncodeSignal(b *testing.B) {
	s := validSignal()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := schemas.EncodeSignal(&s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeSignal measures DecodeSignal, validation included, on the
// encoding of the same signal.
func BenchmarkDecodeSignal(b *testing.B) {
	s := validSignal()
	data, err := schemas.EncodeSignal(&s)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := schemas.DecodeSignal(data, &s); err != nil {
			b.Fatal(err)
		}
	}
}
