package admission

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkAdmissionLeaseAtFewRequestsPerSecond measures, against the real
// Redis, what share of a gateway's admissions its leases serve when a rule
// sees only a few requests a second from it: 12 admissions paced at each
// rate (by the wall clock: the lease's life and horizon are real time),
// each rate on a tenant of its own, lease mode, one gateway.
//
//   - admission_lease_share_requests_<n>_per_sec: a requests rule (60,000 a
//     minute, a sliding window), n requests a second.
//   - admission_lease_share_tokens_<n>_per_sec: a tokens rule (10,000,000 a
//     minute) with requests of 500 tokens.
//
// The first admission of a tenant always goes to Redis (no lease yet), so
// 11/12 (0.917) is every later one served from a lease.
func BenchmarkAdmissionLeaseAtFewRequestsPerSecond(b *testing.B) {
	ctx := context.Background()
	for _, rc := range []struct {
		name   string
		rule   Rule
		tokens int64
		paces  []int
	}{
		{"requests", Rule{Name: "rpm", Unit: Requests, Algorithm: SlidingWindow, Limit: 60_000, Window: time.Minute}, 1, []int{3, 5, 10, 20, 40}},
		{"tokens", Rule{Name: "tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: time.Minute}, 500, []int{1, 3, 10}},
	} {
		l := newTestLimiter(b, testClient(b, ""), &Rules{Default: TenantRules{Rules: []Rule{rc.rule}}}, WithPrefix(testPrefix(b)), WithMaxWait(time.Second))
		for _, pace := range rc.paces {
			tenant := fmt.Sprintf("%s-%d", rc.name, pace)
			before := l.Stats()
			tick := time.NewTicker(time.Second / time.Duration(pace))
			for range 12 {
				if _, err := l.Admit(ctx, Request{Tenant: tenant, PromptTokens: rc.tokens}); err != nil {
					b.Fatal(err)
				}
				<-tick.C
			}
			tick.Stop()
			after := l.Stats()
			b.ReportMetric(float64(after.LeaseHits-before.LeaseHits)/float64(after.Admissions-before.Admissions),
				fmt.Sprintf("admission_lease_share_%s_%d_per_sec", rc.name, pace))
		}
	}
}
