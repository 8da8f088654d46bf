package tally

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// BenchmarkApply measures the in-memory aggregate step alone, one core:
// aggregator_inmemory_events_per_sec, _ns_per_event and _allocs_per_event,
// for 1,000 tenants × 4 models with unique ids (dedup set at its bounded
// capacity), quotas on every tenant, events advancing one second at a time.
func BenchmarkApply(b *testing.B) {
	p := partUnder(b, DefaultOptions(), `
defaults:
  budget: {amount: 1000, currency: USD}
  models:
    "*": {monthly_tokens: 100000000, daily_tokens: 10000000, hourly_tokens: 1000000, tokens_per_minute: 100000, requests_per_minute: 1000}
prices:
  - {model: m0, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
`)
	const tenants, models = 1000, 4
	evs := make([]schemas.UsageEvent, 1<<16)
	for i := range evs {
		evs[i] = schemas.UsageEvent{
			Tenant: fmt.Sprintf("tenant-%d", i%tenants), Model: fmt.Sprintf("m%d", (i/tenants)%models),
			PromptTokens: int64(100 + i%500), CompletionTokens: int64(i % 300),
		}
	}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprintf("id-%012d", i)
	}
	base := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e := &evs[i&(len(evs)-1)]
		e.ID = ids[i]
		e.Time = base.Add(time.Duration(i/1000) * time.Second)
		p.Apply(e, int64(i))
		if len(p.signals) > 1024 {
			p.TakeSignals()
		}
		if len(p.dirty) > 4096 {
			p.ClearDirty()
		}
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns, "aggregator_inmemory_ns_per_event")
	b.ReportMetric(1e9/ns, "aggregator_inmemory_events_per_sec")
}

// BenchmarkAllocsPerEvent reports aggregator_inmemory_allocs_per_event in
// steady state (1,000 tenants × 4 models already known).
func BenchmarkAllocsPerEvent(b *testing.B) {
	p := partUnder(b, DefaultOptions(), `
defaults:
  models:
    "*": {monthly_tokens: 100000000, daily_tokens: 10000000}
`)
	ids := make([]string, 20000)
	for i := range ids {
		ids[i] = fmt.Sprintf("id-%012d", i)
	}
	mk := func(i int) *schemas.UsageEvent {
		return &schemas.UsageEvent{ID: ids[i], Tenant: fmt.Sprintf("tenant-%d", i%1000), Model: fmt.Sprintf("m%d", (i/1000)%4), Time: t0.Add(time.Duration(i) * time.Millisecond), PromptTokens: 10, CompletionTokens: 5}
	}
	warm := make([]*schemas.UsageEvent, 10000)
	for i := range warm {
		warm[i] = mk(i)
		p.Apply(warm[i], int64(i))
	}
	p.ClearDirty()
	p.TakeSignals()
	hot := make([]*schemas.UsageEvent, 10000)
	for i := range hot {
		hot[i] = mk(10000 + i)
	}
	b.ResetTimer()
	var total float64
	for n := 0; n < b.N; n++ {
		q := New(0, DefaultOptions())
		q.SetPolicy(p.pol)
		for i := range warm {
			q.Apply(warm[i], int64(i))
		}
		q.ClearDirty()
		q.TakeSignals()
		i := 0
		total += testing.AllocsPerRun(len(hot)-1, func() {
			q.Apply(hot[i], int64(10000+i))
			i++
			if len(q.dirty) > 1000 {
				q.ClearDirty()
			}
		})
	}
	b.ReportMetric(total/float64(b.N), "aggregator_inmemory_allocs_per_event")
}

// BenchmarkBytesPerSeries reports aggregator_bytes_per_tenant_model: heap
// per tenant × model key (model series or tenant-wide "*" series, with its
// share of the tenant record and of the remembered ids), measured over
// 20,000 tenants × 1 model, i.e. 40,000 keys, three quotas each.
func BenchmarkBytesPerSeries(b *testing.B) {
	pol := mustPolicy(b, `
defaults:
  models:
    "*": {monthly_tokens: 100000000, daily_tokens: 10000000, tokens_per_minute: 10000}
`)
	const n = 20000
	evs := make([]schemas.UsageEvent, n)
	for i := range evs {
		evs[i] = schemas.UsageEvent{ID: fmt.Sprintf("id-%012d", i), Tenant: fmt.Sprintf("tenant-%06d", i), Model: "gpt-4o", Time: t0, PromptTokens: 10}
	}
	var per float64
	for k := 0; k < b.N; k++ {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		p := New(0, Options{Hysteresis: 5, Horizon: time.Hour, DedupCapacity: n, SlowCallMS: 10000})
		p.SetPolicy(pol)
		for i := range evs {
			p.Apply(&evs[i], int64(i))
		}
		p.ClearDirty()
		p.TakeSignals()
		runtime.GC()
		runtime.ReadMemStats(&after)
		// Each tenant here has two tenant × model keys, gpt-4o and "*".
		series, _ := p.Entries()
		per = float64(after.HeapAlloc-before.HeapAlloc) / float64(series)
		runtime.KeepAlive(p)
	}
	b.ReportMetric(per, "aggregator_bytes_per_tenant_model")
}
