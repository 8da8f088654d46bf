package admission

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// budgetLevels are money budgets at the five levels of issue 34, each a
// monthly cost period (exact, as money limits are by default) high enough
// never to refuse: the organisation (a top-level rule), and the tenant
// (team), API key, end user and agent session as the tenant's own rules.
// levels: how many of them, from the organisation down.
func budgetLevels(levels int) *Rules {
	month := func(name string, scope Scope) Rule {
		return Rule{Name: name, Scope: scope, Unit: Cost, Algorithm: CalendarPeriod, Limit: 1 << 50, Calendar: utcMonths{}, Exact: true}
	}
	all := []Rule{month("org-budget", Scope{Organization: Each}), month("team-budget", Scope{}), month("key-budget", Scope{Key: Each}),
		month("user-budget", Scope{User: Each}), month("session-budget", Scope{Session: Each})}[:levels]
	return &Rules{Shared: all[:1], Default: TenantRules{Rules: all[1:]}}
}

// levelRequest is call i: 64 teams in 8 organisations, 4 keys a team,
// users from a pool of 100,000 and a session per 10 calls of a user, each
// call debited a worst case of 2,000 millionths (USD 0.002).
func levelRequest(i int) Request {
	team := i & 63
	user := (i * 7919) % 100_000
	return Request{Tenant: benchTenants[team], Organization: "org-" + strconv.Itoa(team&7), Key: "key-" + strconv.Itoa(i&255),
		User: "user-" + strconv.Itoa(user), Session: "session-" + strconv.Itoa(user) + "-" + strconv.Itoa(i/1_000_000),
		Model: "gpt-4o", PromptTokens: 300, CompletionTokens: 100, Cost: 2000}
}

// BenchmarkAdmissionBudgetLevels measures what money budgets at every
// level cost a call on the request path (issue 34): Admit of a call five
// monthly cost budgets apply to — organisation, team, key, end user,
// session — against the real Redis, and the settlement of its real cost
// after it, as sluice gateway does for each call:
//
//   - admission_budget_levels5_ns (_p50_ns, _p99_ns, _cpu_ns,
//     _allocs): the Admit, wall and CPU;
//   - admission_budget_levels5_roundtrips_per_call: Redis round trips per
//     admitted and settled call (the settlement's included);
//   - admission_budget_levels1_ns and _roundtrips_per_call: the same call
//     with the organisation's budget alone, for what the other four add.
//
// The strings of each Request are built before the timed loop's call, as
// a gateway has them from the request.
func BenchmarkAdmissionBudgetLevels(b *testing.B) {
	ctx := context.Background()
	reqs := make([]Request, 4096)
	for i := range reqs {
		reqs[i] = levelRequest(i)
	}
	for _, levels := range []int{1, 5} {
		b.Run("levels"+strconv.Itoa(levels), func(b *testing.B) {
			prefix := "admission_budget_levels" + strconv.Itoa(levels)
			l := newTestLimiter(b, testClient(b, ""), budgetLevels(levels), WithPrefix(testPrefix(b)), WithMaxWait(time.Second))
			call := func(i int) {
				tk, _ := l.Admit(ctx, reqs[i&4095])
				benchSink = tk.Decision.Allowed
				_ = tk.Settle(ctx, Usage{PromptTokens: 300, CompletionTokens: 80, Cost: 1700})
			}
			for i := range 1000 {
				call(i)
			}
			before := l.Stats()
			timeOps(b, prefix, call)
			after := l.Stats()
			b.ReportMetric(float64(after.RedisRoundTrips-before.RedisRoundTrips)/float64(after.Admissions-before.Admissions), prefix+"_roundtrips_per_call")
			r := reqs[7]
			b.ReportMetric(testing.AllocsPerRun(1000, func() {
				tk, _ := l.Admit(ctx, r)
				benchSink = tk.Decision.Allowed
			}), prefix+"_allocs")
		})
	}
}

// BenchmarkBudgetLevelsMemory measures the Redis memory money budgets at
// every level cost when end users number in the millions (issue 34):
// SLUICE_ADMISSION_BENCH_USERS end users (1,000,000 by default) each make
// one call in one session of their own, admitted through admit.lua under
// the five levels' monthly cost budgets (pipelined 1,000 calls a round
// trip). Only levels that have a budget keep a counter, one per distinct
// value and month: the organisations', teams' and keys' are few, so what
// grows is a user's and a session's. Keys:
// admission_budget_levels_bytes_per_end_user (MEMORY USAGE of the user's
// and its session's counters, 1,000 users sampled) and
// admission_budget_levels_info_bytes_per_end_user (the rise of INFO
// used_memory over the fill, over the users; the Redis is shared).
func BenchmarkBudgetLevelsMemory(b *testing.B) {
	users := benchUsers(b)
	ctx := context.Background()
	c := testClient(b, "")
	prefix := benchPrefix(b, c)
	m := mustMetrics(b)
	rules := budgetLevels(5)
	all := append(append([]Rule(nil), rules.Shared...), rules.Default.Rules...)
	compiled := make([]*rule, len(all))
	for i, r := range all {
		compiled[i] = compileRule(r, i == 0, 0, m)
	}
	scopeOf := func(i int) Scope {
		team := i & 63
		return Scope{Tenant: benchTenants[team], Organization: "org-" + strconv.Itoa(team&7), Key: "key-" + strconv.Itoa(i&255),
			User: "user-" + strconv.Itoa(i), Session: "session-" + strconv.Itoa(i)}
	}
	for range b.N { // the figures are of the last round
		unlinkPrefix(b, c, prefix)
		before := usedMemory(b, c)
		const batch = 1000
		for from := 0; from < users; from += batch {
			fill := func() error {
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for i := from; i < min(from+batch, users); i++ {
						s := scopeOf(i)
						for _, r := range compiled {
							rate, gran, _ := r.args(time.Now())
							admitScript.EvalSha(ctx, p, []string{instanceKey(prefix, r, s)}, 1, r.kind, r.argLimit, rate, gran, 2000, 0, 0)
						}
					}
					return nil
				})
				return err
			}
			// A test elsewhere that flushes the shared Redis's scripts (the
			// enforcer's NOSCRIPT test) costs the batch a reload and a resend.
			err := fill()
			if err != nil && isNoScript(err) {
				if err = admitScript.Load(ctx, c).Err(); err == nil {
					err = fill()
				}
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		after := usedMemory(b, c)
		b.ReportMetric(float64(after-before)/float64(users), "admission_budget_levels_info_bytes_per_end_user")
		perUser := meanMemoryUsage(b, c, users, func(i int) string { return instanceKey(prefix, compiled[3], scopeOf(i)) }) +
			meanMemoryUsage(b, c, users, func(i int) string { return instanceKey(prefix, compiled[4], scopeOf(i)) })
		b.ReportMetric(perUser, "admission_budget_levels_bytes_per_end_user")
	}
}
