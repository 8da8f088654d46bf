package upstream

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
)

// priorityBenchDuration is how long BenchmarkPriority offers its load:
// SLUICE_PRIORITY_BENCH_DURATION (a Go duration; the figure is
// 60s), default 5 s so that `make bench` stays short.
var priorityBenchDuration = func() time.Duration {
	if v := os.Getenv("SLUICE_PRIORITY_BENCH_DURATION"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= time.Second && d <= time.Hour {
			return d
		}
		fmt.Fprintf(os.Stderr, "SLUICE_PRIORITY_BENCH_DURATION=%q: want a duration from 1s to 1h; using 5s\n", v)
	}
	return 5 * time.Second
}()

// The bench upstream: capacity 50 concurrent calls answered in 100 ms
// (500 calls/s); past 50 in flight a call that starts with n in flight
// takes 100 ms × n / 50 (the calls share the capacity), and the upstream
// finishes every call it started even when the caller has given up, as a
// provider finishes a generation. Callers give up after 2 s.
const (
	benchCapacity = 50
	benchBase     = 100 * time.Millisecond
	benchTimeout  = 2 * time.Second
	benchDeadline = time.Second // latest start of a queued call
)

type benchUpstream struct {
	inflight atomic.Int64
}

// call runs one call and reports whether the caller got its answer within
// benchTimeout.
func (u *benchUpstream) call() bool {
	n := u.inflight.Add(1)
	lat := benchBase
	if n > benchCapacity {
		lat = time.Duration(float64(benchBase) * float64(n) / benchCapacity)
	}
	time.AfterFunc(lat, func() { u.inflight.Add(-1) })
	if lat > benchTimeout {
		time.Sleep(benchTimeout)
		return false
	}
	time.Sleep(lat)
	return true
}

// offer sends 2× the upstream's capacity (1,000 requests/s), classes in
// turn, for d, each through do, and waits for every request to end.
func offer(d time.Duration, do func(c schemas.Priority)) {
	const every = time.Millisecond // 1,000/s
	var wg sync.WaitGroup
	start := time.Now()
	sent := 0
	for time.Since(start) < d {
		due := int(time.Since(start) / every)
		for ; sent < due; sent++ {
			c := schemas.Priorities[sent%schemas.NumPriorities]
			wg.Go(func() { do(c) })
		}
		time.Sleep(every)
	}
	wg.Wait()
}

func quantileMS(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return float64(ds[int(q*float64(len(ds)-1))].Microseconds()) / 1000
}

// BenchmarkPriority reports, for four classes offering 2× the capacity of
// the bench upstream between them for priorityBenchDuration, through a
// Guard with a fixed limit of 50 and the default queue (1,000 places,
// minimum shares high 15%, normal 10%, low 5%) and degradation levels,
// each request with a 1 s queue deadline:
//
//   - priority_<class>_wait_p50_ms, priority_<class>_wait_p99_ms: queue
//     wait of the admitted requests;
//   - priority_<class>_shed: requests refused (deadline, queue full,
//     shed, expired or degraded);
//   - priority_goodput_per_sec_admission: calls answered within 2 s per
//     second of the run;
//   - priority_goodput_per_sec_no_admission: the same load sent straight
//     to the upstream.
func BenchmarkPriority(b *testing.B) {
	if testing.Short() {
		b.Skip("runs for seconds")
	}
	d := priorityBenchDuration
	for range b.N {
		var (
			mu    sync.Mutex
			waits [schemas.NumPriorities][]time.Duration
			shed  [schemas.NumPriorities]int
			good  atomic.Int64
		)
		up := &benchUpstream{}
		g, err := New("bench", Limit(concurrency.Fixed(benchCapacity)))
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		offer(d, func(c schemas.Priority) {
			p, dec := g.Acquire(context.Background(), Request{Tenant: string(c), Priority: c, Deadline: time.Now().Add(benchDeadline)})
			if !dec.Admitted() {
				mu.Lock()
				shed[c.Index()]++
				mu.Unlock()
				return
			}
			mu.Lock()
			waits[c.Index()] = append(waits[c.Index()], dec.Waited)
			mu.Unlock()
			ok := up.call()
			if ok && time.Since(start) <= d {
				good.Add(1)
			}
			o := concurrency.Success
			if !ok {
				o = concurrency.Failure
			}
			p.Release(o)
		})
		b.StopTimer()
		for _, c := range schemas.Priorities {
			i := c.Index()
			b.ReportMetric(quantileMS(waits[i], 0.50), fmt.Sprintf("priority_%s_wait_p50_ms", c))
			b.ReportMetric(quantileMS(waits[i], 0.99), fmt.Sprintf("priority_%s_wait_p99_ms", c))
			b.ReportMetric(float64(shed[i]), fmt.Sprintf("priority_%s_shed", c))
		}
		b.ReportMetric(float64(good.Load())/d.Seconds(), "priority_goodput_per_sec_admission")

		// The same load without admission control.
		bare := &benchUpstream{}
		good.Store(0)
		start = time.Now()
		offer(d, func(schemas.Priority) {
			if bare.call() && time.Since(start) <= d {
				good.Add(1)
			}
		})
		b.ReportMetric(float64(good.Load())/d.Seconds(), "priority_goodput_per_sec_no_admission")
		b.ReportMetric(d.Seconds(), "priority_bench_seconds")
		// Let the upstream's abandoned calls finish before the next run.
		for bare.inflight.Load() > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// BenchmarkPriorityGuardAdmit reports priority_guard_admit_ns and
// priority_guard_admit_allocs: one Guard.Acquire that finds a free slot
// (breaker closed, level 0, a tenant limit) and its Release, one core —
// the cost every request pays when the upstream is not saturated.
func BenchmarkPriorityGuardAdmit(b *testing.B) {
	g, err := New("bench", Limit(concurrency.Fixed(1000)), TenantShare(0.5))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	r := Request{Tenant: "acme", Priority: schemas.PriorityHigh}
	b.ReportAllocs()
	for b.Loop() {
		p, _ := g.Acquire(ctx, r)
		p.Release(concurrency.Success)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "priority_guard_admit_ns")
	b.ReportMetric(float64(testing.AllocsPerRun(100, func() {
		p, _ := g.Acquire(ctx, r)
		p.Release(concurrency.Success)
	})), "priority_guard_admit_allocs")
}
