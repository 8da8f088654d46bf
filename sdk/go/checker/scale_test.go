package checker

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// scaleSizes are the flagged-key counts of the growth curves (issue 19).
var scaleSizes = []int{1_000, 10_000, 100_000, 1_000_000}

// BenchmarkScaleChecker measures the Checker's growth curve: for 1,000,
// 10,000, 100,000 and 1,000,000 flagged tenants (every tenant flagged on
// one model, see load), the heap the Checker holds per flagged tenant
// (scale_checker_bytes_per_flagged_key_<n>: live heap after a GC with
// the flags loaded, minus before, over n) and one Check of a tenant picked
// at random among them, one goroutine (scale_checker_check_ns_<n>; every
// lookup is a hit, the worst case), next to a plain Go map of the same
// names looked up with the same requests in the same run
// (scale_checker_vs_map_ratio_<n>).
func BenchmarkScaleChecker(b *testing.B) {
	for _, n := range itest.ScaleSizes(b, scaleSizes...) {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			before := liveHeap()
			c := newTestChecker(b)
			load(c, n)
			held := liveHeap() - before
			reqs := scaleRequests(n)
			mask := len(reqs) - 1
			b.ResetTimer()
			start := time.Now()
			var acc Outcome
			for i := 0; i < b.N; i++ {
				r := &reqs[i&mask]
				acc += c.Check(r.tenant, r.model, r.key).Outcome
			}
			ns := float64(time.Since(start).Nanoseconds()) / float64(b.N)
			b.StopTimer()
			benchSink = acc

			ref := make(map[string]bool, n)
			for i := range n {
				ref[fmt.Sprintf("tenant-%06d", i)] = true
			}
			lookups := max(b.N, 1_000_000)
			hits := 0
			rs := time.Now()
			for i := range lookups {
				if ref[reqs[i&mask].tenant] {
					hits++
				}
			}
			refNs := float64(time.Since(rs).Nanoseconds()) / float64(lookups)
			benchSink = Outcome(hits)
			runtime.KeepAlive(c)

			b.ReportMetric(float64(held)/float64(n), fmt.Sprintf("scale_checker_bytes_per_flagged_key_%d", n))
			b.ReportMetric(ns, fmt.Sprintf("scale_checker_check_ns_%d", n))
			b.ReportMetric(ns/refNs, fmt.Sprintf("scale_checker_vs_map_ratio_%d", n))
		})
	}
}

// scaleRequests returns 1<<18 requests for tenants picked at random among
// the n that load flags, their names cut from one buffer written in
// request order (see benchRequests for why).
func scaleRequests(n int) []benchRequest {
	r := rand.New(rand.NewPCG(3, uint64(n)))
	const count = 1 << 18
	var buf strings.Builder
	ends := make([]int, count)
	for i := range ends {
		fmt.Fprintf(&buf, "tenant-%06d", r.IntN(n))
		ends[i] = buf.Len()
	}
	all := buf.String()
	reqs := make([]benchRequest, count)
	prev := 0
	for i, end := range ends {
		reqs[i] = benchRequest{tenant: all[prev:end], model: benchModels[i%len(benchModels)], key: "key-1"}
		prev = end
	}
	return reqs
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
