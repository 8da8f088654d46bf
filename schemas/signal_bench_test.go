package schemas_test

import (
	"runtime"
	"syscall"
	"testing"
	"time"

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
// encoding of the same signal, one goroutine. It reports
//
//   - signal_decode_ns: wall time per signal;
//   - signal_decode_cpu_ns: CPU time of the process (user + system, the
//     garbage collector included) per signal, which moves much less than
//     the wall time with what else the machine runs;
//   - signal_decode_allocs: heap allocations per signal;
//   - signal_decode_encoding_json_ns and signal_decode_encoding_json_cpu_ns:
//     the reference in the same run, the same signal through the same
//     judges and validation with its members walked by encoding/json's
//     Decoder (DecodeSignal's walker until issue 37), and
//     signal_decode_vs_encoding_json_ratio, the CPU figures' ratio.
func BenchmarkDecodeSignal(b *testing.B) {
	s := validSignal()
	data, err := schemas.EncodeSignal(&s)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	b.ResetTimer()
	for b.Loop() {
		if err := schemas.DecodeSignal(data, &s); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&ms1)
	n := float64(b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "signal_decode_ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "signal_decode_cpu_ns")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "signal_decode_allocs")

	// The reference, right after, on the same signal.
	rounds := max(b.N/10, 200)
	start, cpu0 := time.Now(), processCPU()
	for range rounds {
		if err := schemas.DecodeSignalReference(data, &s); err != nil {
			b.Fatal(err)
		}
	}
	refCPU := processCPU() - cpu0
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(rounds), "signal_decode_encoding_json_ns")
	b.ReportMetric(float64(refCPU.Nanoseconds())/float64(rounds), "signal_decode_encoding_json_cpu_ns")
	b.ReportMetric((float64(cpu)/n)/(float64(refCPU)/float64(rounds)), "signal_decode_vs_encoding_json_ratio")
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
