package checker

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sdk/go/flags"
)

func newTestChecker(t testing.TB) *Checker {
	t.Helper()
	c, err := New(nil, DefaultConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// install puts tenant's hash fields into c as a change fetch would.
func install(c *Checker, tenant string, version int64, fl map[string]*flags.Flag) {
	fields := map[string]string{flags.VersionField: fmt.Sprint(version)}
	for k, f := range fl {
		fields[k] = flags.Encode(f)
	}
	c.apply(map[string]*tenantView{tenant: c.buildView(tenant, fields)}, 0, false)
}

func TestCheckFindsModelTenantWideAndKeyFlags(t *testing.T) {
	c := newTestChecker(t)
	until := time.Now().Add(time.Hour)
	install(c, "acme", 1, map[string]*flags.Flag{
		"gpt-4o":             {State: flags.StateOpen, Kind: flags.KindQuota, Quota: "monthly_tokens", Period: "month", Until: until, Limit: 100, Used: 100, ResetsAt: until},
		flags.KeyField("k1"): {State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until, Reason: "leaked"},
	})
	install(c, "globex", 1, map[string]*flags.Flag{flags.AllModels: {State: flags.StateThrottle, Kind: flags.KindRate, Quota: "requests_per_minute", Until: until}})

	if d := c.Check("acme", "gpt-4o", ""); d.Allowed() || d.Flag.Quota != "monthly_tokens" || d.Scope != "gpt-4o" {
		t.Fatalf("model flag: %+v", d)
	}
	if d := c.Check("acme", "gpt-4o-mini", ""); !d.Allowed() {
		t.Fatalf("other model refused: %+v", d)
	}
	if d := c.Check("acme", "gpt-4o-mini", "k1"); d.Allowed() || d.Flag.Kind != flags.KindBlacklist {
		t.Fatalf("blacklisted key allowed: %+v", d)
	}
	if d := c.Check("globex", "anything", ""); d.Allowed() || d.Scope != flags.AllModels {
		t.Fatalf("tenant-wide flag: %+v", d)
	}
	if d := c.Check("initech", "gpt-4o", ""); !d.Allowed() {
		t.Fatalf("unknown tenant refused: %+v", d)
	}
}

// TestSoftFlagRefusesNothingAndOverFindsIt: a soft flag (a soft quota
// past its limit) never refuses, not even a half-open probe's turn, and
// Over reports it for its scope until it expires; a refusing flag on
// another matching scope still refuses.
func TestSoftFlagRefusesNothingAndOverFindsIt(t *testing.T) {
	c := newTestChecker(t)
	until := time.Now().Add(time.Hour)
	soft := &flags.Flag{State: flags.StateSoft, Kind: flags.KindQuota, Quota: "monthly_tokens", Period: "month", Until: until, Limit: 100, Used: 120, ResetsAt: until}
	install(c, "acme", 1, map[string]*flags.Flag{flags.AllModels: soft,
		"gpt-4o": {State: flags.StateThrottle, Kind: flags.KindRate, Quota: "tokens_per_minute", Until: until}})
	install(c, "globex", 1, map[string]*flags.Flag{flags.KeyField("k1"): soft})
	if d := c.Check("acme", "gpt-4o-mini", ""); !d.Allowed() || d.Outcome != Allowed || d.Flag != nil {
		t.Fatalf("a soft flag refused or probed: %+v", d)
	}
	if f := c.Over("acme", "gpt-4o-mini", ""); f == nil || f.State != flags.StateSoft || f.Quota != "monthly_tokens" {
		t.Fatalf("Over on the tenant-wide soft flag: %+v", f)
	}
	if d := c.Check("acme", "gpt-4o", ""); d.Allowed() || d.Flag.State != flags.StateThrottle {
		t.Fatalf("the throttle beside a soft flag: %+v, want refused", d)
	}
	if c.Over("globex", "m", "k2") != nil || c.Over("globex", "m", "k1") == nil || c.Over("initech", "m", "k1") != nil {
		t.Fatal("Over: a key's soft flag must apply to that key alone, and no flag to an unknown tenant")
	}
	c.clock.Store(until.UnixNano())
	if c.Over("acme", "gpt-4o-mini", "") != nil {
		t.Fatal("an expired soft flag still applies")
	}
}

func TestExpiredFlagNoLongerApplies(t *testing.T) {
	c := newTestChecker(t)
	until := time.Now().Add(time.Hour)
	install(c, "acme", 1, map[string]*flags.Flag{"*": {State: flags.StateOpen, Kind: flags.KindManual, Until: until}})
	if d := c.Check("acme", "m", ""); d.Allowed() {
		t.Fatalf("live flag does not refuse: %+v", d)
	}
	c.clock.Store(until.UnixNano())
	if d := c.Check("acme", "m", ""); !d.Allowed() {
		t.Fatalf("expired flag still refuses: %+v", d)
	}
}

func TestHalfOpenLetsBoundedProbesThrough(t *testing.T) {
	c := newTestChecker(t)
	install(c, "acme", 1, map[string]*flags.Flag{"m": {State: flags.StateHalfOpen, Kind: flags.KindErrorRatio, Probes: 3, Until: time.Now().Add(time.Hour)}})
	probes := 0
	for range 10 {
		d := c.Check("acme", "m", "")
		if d.Outcome == Probe {
			probes++
		} else if d.Outcome != Refused {
			t.Fatalf("unexpected outcome %+v", d)
		}
	}
	if probes != 3 {
		t.Fatalf("%d probes let through, want 3", probes)
	}
}

func TestStaleViewFollowsEachTenantsFailMode(t *testing.T) {
	c := newTestChecker(t)
	c.failModes.Store(&map[string]FailMode{"strict": FailClosed, "*": FailOpen})
	c.lastFresh.Store(time.Now().Add(-time.Hour).UnixNano())
	c.updateStale()
	if d := c.Check("strict", "m", ""); d.Outcome != RefusedStale {
		t.Fatalf("fail-closed tenant allowed on a stale view: %+v", d)
	}
	if d := c.Check("relaxed", "m", ""); !d.Allowed() || !d.Stale {
		t.Fatalf("fail-open tenant: %+v", d)
	}
	c.fresh()
	if d := c.Check("strict", "m", ""); !d.Allowed() || d.Stale {
		t.Fatalf("fresh view still refuses: %+v", d)
	}
}

func TestNewerVersionIsNotOverwrittenByOlderRead(t *testing.T) {
	c := newTestChecker(t)
	f := &flags.Flag{State: flags.StateOpen, Kind: flags.KindManual, Until: time.Now().Add(time.Hour)}
	install(c, "acme", 5, map[string]*flags.Flag{"*": f})
	// A full resync that started before version 5 was written saw nothing.
	c.apply(map[string]*tenantView{}, 4, true)
	if d := c.Check("acme", "m", ""); d.Allowed() {
		t.Fatal("resync older than the change dropped it")
	}
	c.apply(map[string]*tenantView{}, 5, true)
	if d := c.Check("acme", "m", ""); !d.Allowed() {
		t.Fatal("resync newer than the flag kept a deleted tenant")
	}
}

func TestCheckDoesNotAllocate(t *testing.T) {
	c := newTestChecker(t)
	load(c, 1000)
	allocs := testing.AllocsPerRun(1000, func() {
		c.Check("tenant-000500", "gpt-4o", "key-1")
		c.Check("tenant-000501", "gpt-4o", "")
		c.Check("nobody", "gpt-4o", "")
	})
	if allocs != 0 {
		t.Fatalf("Check allocates %v times per run", allocs)
	}
}

func TestConfigValidateNamesFieldAndLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxStaleness, cfg.DefaultFailMode, cfg.MaxPending = time.Millisecond, "maybe", 0
	err := cfg.Validate()
	for _, want := range []string{"max_staleness", "100ms", "default_fail_mode", "max_pending", "1..1000000"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// load installs n tenants, every other one with a refusing flag.
func load(c *Checker, n int) {
	until := time.Now().Add(time.Hour)
	updates := make(map[string]*tenantView, n)
	for i := range n {
		name := fmt.Sprintf("tenant-%06d", i)
		fields := map[string]string{flags.VersionField: "1"}
		if i%2 == 0 {
			fields["gpt-4o"] = flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "daily_tokens", Until: until})
		} else {
			fields["claude"] = flags.Encode(&flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate, Until: until})
		}
		updates[name] = c.buildView(name, fields)
	}
	c.apply(updates, 0, false)
}

// TestHalfOpenDoesNotBypassOtherScopes: a half-open model breaker used to
// let its probes through whatever else applied to the tenant or the key.
// Every matching scope is evaluated and any refusal wins, without spending
// the probes.
func TestHalfOpenDoesNotBypassOtherScopes(t *testing.T) {
	until := time.Now().Add(time.Hour)
	halfOpen := &flags.Flag{State: flags.StateHalfOpen, Kind: flags.KindErrorRatio, Probes: 3, Until: until}
	for name, other := range map[string]map[string]*flags.Flag{
		"tenant-wide blacklist": {flags.AllModels: {State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until}},
		"tenant-wide quota":     {flags.AllModels: {State: flags.StateOpen, Kind: flags.KindQuota, Quota: "monthly_tokens", Until: until, ResetsAt: until}},
		"key blacklist":         {flags.KeyField("k1"): {State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newTestChecker(t)
			fl := map[string]*flags.Flag{"m": halfOpen}
			for k, f := range other {
				fl[k] = f
			}
			install(c, "acme", 1, fl)
			for i := range 5 {
				if d := c.Check("acme", "m", "k1"); d.Outcome != Refused || d.Flag.State == flags.StateHalfOpen {
					t.Fatalf("check %d: %+v, want refused by the %s", i, d, name)
				}
			}
			// The refusals did not spend the model's probes.
			install(c, "acme", 2, map[string]*flags.Flag{"m": halfOpen})
			if d := c.Check("acme", "m", "k1"); d.Outcome != Probe {
				t.Fatalf("after the other flag went: %+v, want a probe", d)
			}
		})
	}
}

// probesIn counts how many of n checks of tenant acme's model c lets
// through as probes.
func probesIn(c *Checker, model string, n int) int {
	probes := 0
	for range n {
		if c.Check("acme", model, "").Outcome == Probe {
			probes++
		}
	}
	return probes
}

// TestHalfOpenEverywhereSpendsEachScopesProbes: with the model and "*"
// both half-open, a probe needs one of each; when one has none left the
// other's is given back.
func TestHalfOpenEverywhereSpendsEachScopesProbes(t *testing.T) {
	c := newTestChecker(t)
	until := time.Now().Add(time.Hour)
	install(c, "acme", 1, map[string]*flags.Flag{
		"m":             {State: flags.StateHalfOpen, Kind: flags.KindErrorRatio, Probes: 5, Until: until},
		flags.AllModels: {State: flags.StateHalfOpen, Kind: flags.KindSlowCall, Probes: 2, Until: until},
	})
	probes := probesIn(c, "m", 10)
	if probes != 2 {
		t.Fatalf("%d probes, want 2 (the tenant-wide breaker's)", probes)
	}
	if d := c.Check("acme", "other", ""); d.Outcome != Refused {
		t.Fatalf("other model after the tenant-wide probes ran out: %+v", d)
	}
}

// TestProbesSurviveRebuild: the periodic resync rebuilds every view; a
// half-open breaker that is still the same must not hand out a new set of
// probes each time (the enforcer moves Until on every rewrite).
func TestProbesSurviveRebuild(t *testing.T) {
	c := newTestChecker(t)
	f := &flags.Flag{State: flags.StateHalfOpen, Kind: flags.KindErrorRatio, Probes: 3, Until: time.Now().Add(time.Minute)}
	install(c, "acme", 1, map[string]*flags.Flag{"m": f})
	for range 2 {
		if d := c.Check("acme", "m", ""); d.Outcome != Probe {
			t.Fatalf("%+v, want a probe", d)
		}
	}
	rewritten := *f
	rewritten.Until = f.Until.Add(30 * time.Second)
	install(c, "acme", 2, map[string]*flags.Flag{"m": &rewritten})                // a refetch after a rewrite
	c.apply(map[string]*tenantView{"acme": c.buildView("acme", map[string]string{ // a full resync
		flags.VersionField: "2", "m": flags.Encode(&rewritten)})}, 2, true)
	probes := probesIn(c, "m", 5)
	if probes != 1 {
		t.Fatalf("%d probes after rebuilds, want the 1 left", probes)
	}
	// A new half-open period (after an open one) is a new breaker state.
	install(c, "acme", 3, map[string]*flags.Flag{"m": {State: flags.StateOpen, Kind: flags.KindErrorRatio, Until: f.Until}})
	install(c, "acme", 4, map[string]*flags.Flag{"m": f})
	if d := c.Check("acme", "m", ""); d.Outcome != Probe {
		t.Fatalf("new half-open period: %+v, want a probe", d)
	}
}

// TestStaleViewLapsesTrafficFlagsFlagTTLAfterLastBeat: the enforcer
// writes a quota flag's own end as its Until (an hour ahead here) and no
// longer rewrites it, so a fresh view keeps it for as long as the enforcer
// lives, and a stale one (the enforcer died) drops it flag_ttl after the
// enforcer's last sign of life: a dead enforcer blocks no one longer than
// flag_ttl. Manual breakers keep their stale-view rule.
func TestStaleViewLapsesTrafficFlagsFlagTTLAfterLastBeat(t *testing.T) {
	c := newTestChecker(t)
	c.failModes.Store(&map[string]FailMode{"*": FailOpen})
	now := time.Now()
	until := now.Add(time.Hour)
	install(c, "initech", 1, map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindQuota, Quota: "monthly_tokens", Until: until, ResetsAt: until}})
	install(c, "globex", 1, map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindManual}})

	// Fresh, 50 minutes on: the flag written once is still in force.
	c.lastFresh.Store(now.Add(50 * time.Minute).UnixNano())
	c.clock.Store(now.Add(50 * time.Minute).UnixNano())
	if d := c.Check("initech", "m", ""); d.Outcome != Refused || d.Stale {
		t.Fatalf("quota flag an hour long on a fresh view 50 minutes on: %+v, want refused", d)
	}
	if d := c.Over("initech", "m", ""); d != nil {
		t.Fatalf("Over of a hard quota: %+v, want nil", d)
	}

	// The last beat at +50 min; stale since; flag_ttl is 60 s by default.
	lastBeat := now.Add(50 * time.Minute)
	c.lastFresh.Store(lastBeat.UnixNano())
	c.stale.Store(true)
	c.clock.Store(lastBeat.Add(flags.DefaultFlagTTL - time.Millisecond).UnixNano())
	if d := c.Check("initech", "m", ""); d.Outcome != Refused || !d.Stale {
		t.Fatalf("quota flag on a stale view just under flag_ttl after the last beat: %+v, want refused", d)
	}
	c.clock.Store(lastBeat.Add(flags.DefaultFlagTTL).UnixNano())
	if d := c.Check("initech", "m", ""); !d.Allowed() {
		t.Fatalf("quota flag on a stale view flag_ttl after the last beat: %+v, want lapsed", d)
	}
	if d := c.Check("globex", "m", ""); d.Outcome != Refused {
		t.Fatalf("manual breaker on a stale view: %+v, want refused", d)
	}
	// The flag_ttl the enforcer published counts, not the default.
	c.flagTTL.Store(int64(10 * time.Minute))
	if d := c.Check("initech", "m", ""); d.Outcome != Refused {
		t.Fatalf("quota flag on a stale view 60 s after the last beat, flag_ttl 10m: %+v, want refused", d)
	}
	// Fresh again (the enforcer is back): the flag applies until its Until.
	c.lastFresh.Store(lastBeat.Add(flags.DefaultFlagTTL).UnixNano())
	c.stale.Store(false)
	if d := c.Check("initech", "m", ""); d.Outcome != Refused {
		t.Fatalf("quota flag on a fresh view again: %+v, want refused", d)
	}
}

// TestOperatorFlagsOutliveUntilWhileStale: a gateway cut off from Redis
// must keep a blacklist or manual breaker past its Until (older enforcers
// capped it a minute ahead), while breakers tied to traffic lapse.
func TestOperatorFlagsOutliveUntilWhileStale(t *testing.T) {
	c := newTestChecker(t)
	c.failModes.Store(&map[string]FailMode{"*": FailOpen})
	until := time.Now().Add(time.Minute)
	install(c, "acme", 1, map[string]*flags.Flag{flags.KeyField("leaked"): {State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until}})
	install(c, "globex", 1, map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindManual, Until: until}})
	install(c, "initech", 1, map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindQuota, Until: until}})

	c.lastFresh.Store(time.Now().Add(-time.Hour).UnixNano()) // Redis lost long ago
	c.updateStale()
	c.clock.Store(until.Add(time.Minute).UnixNano()) // past every Until
	if d := c.Check("acme", "m", "leaked"); d.Outcome != Refused || !d.Stale {
		t.Fatalf("blacklisted key on a stale view past Until: %+v, want refused", d)
	}
	if d := c.Check("globex", "m", ""); d.Outcome != Refused {
		t.Fatalf("manual breaker on a stale view past Until: %+v, want refused", d)
	}
	if d := c.Check("initech", "m", ""); !d.Allowed() {
		t.Fatalf("quota breaker past Until: %+v, want lapsed", d)
	}
	// Fresh again, an expired Until means the enforcer lifted it.
	c.fresh()
	if d := c.Check("acme", "m", "leaked"); !d.Allowed() {
		t.Fatalf("expired blacklist on a fresh view: %+v, want lapsed", d)
	}
}

// TestBeforeFirstSync documents the initial state: no flags and no fail
// modes are known; the view counts as fresh for MaxStaleness after New and
// then every tenant gets DefaultFailMode.
func TestBeforeFirstSync(t *testing.T) {
	for _, mode := range []FailMode{FailOpen, FailClosed} {
		cfg := DefaultConfig()
		cfg.DefaultFailMode = mode
		c, err := New(nil, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if c.Synced() {
			t.Fatal("synced before any resync")
		}
		if d := c.Check("acme", "m", ""); d.Outcome != Allowed || d.Stale {
			t.Fatalf("%s: right after New: %+v, want allowed, not stale", mode, d)
		}
		c.lastFresh.Store(time.Now().Add(-cfg.MaxStaleness - time.Second).UnixNano())
		c.updateStale()
		d := c.Check("acme", "m", "")
		if mode == FailClosed && d.Outcome != RefusedStale || mode == FailOpen && (d.Outcome != Allowed || !d.Stale) {
			t.Fatalf("%s: MaxStaleness after New without a sync: %+v", mode, d)
		}
	}
}

// TestOperatorFlagsOutliveExpiredHashesWhileStale: with Redis reachable but
// no enforcer (stale), the tenant hashes expire after flag_ttl and a resync
// finds nothing; blacklists and manual breakers are kept, traffic breakers
// go. Once fresh, a resync that does not see them drops them.
func TestOperatorFlagsOutliveExpiredHashesWhileStale(t *testing.T) {
	c := newTestChecker(t)
	until := time.Now().Add(time.Minute)
	install(c, "acme", 1, map[string]*flags.Flag{
		flags.KeyField("leaked"): {State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until},
		"gpt-4o":                 {State: flags.StateOpen, Kind: flags.KindQuota, Until: until},
	})
	install(c, "globex", 1, map[string]*flags.Flag{flags.AllModels: {State: flags.StateOpen, Kind: flags.KindManual, Until: until}})
	c.lastFresh.Store(time.Now().Add(-time.Hour).UnixNano())
	c.updateStale()
	c.apply(map[string]*tenantView{}, 10, true)                                                     // every hash expired
	c.apply(map[string]*tenantView{"globex": c.buildView("globex", map[string]string{})}, 0, false) // a refetch finds none
	if d := c.Check("acme", "m", "leaked"); d.Outcome != Refused {
		t.Fatalf("blacklisted key after its hash expired, view stale: %+v", d)
	}
	if d := c.Check("acme", "gpt-4o", ""); !d.Allowed() {
		t.Fatalf("quota breaker kept after its hash expired: %+v", d)
	}
	if d := c.Check("globex", "m", ""); d.Outcome != Refused {
		t.Fatalf("manual breaker after its hash expired, view stale: %+v", d)
	}
	c.fresh()
	c.apply(map[string]*tenantView{}, 10, true)
	if d := c.Check("acme", "m", "leaked"); !d.Allowed() {
		t.Fatalf("fresh resync without the blacklist kept it: %+v", d)
	}
	if n := c.Tenants(); n != 0 {
		t.Fatalf("%d tenants left after a fresh empty resync", n)
	}
}

// A refresh replaces the views of tenants already flagged (in place, see
// replaceInPlace) while Checks run; one apply may mix such replacements
// with a new tenant and a tenant whose flags went, and each must land.
func TestRefreshReplacesViewsUnderConcurrentChecks(t *testing.T) {
	c := newTestChecker(t)
	load(c, 2000) // even tenants: gpt-4o refused; odd: claude refused
	done := make(chan struct{})
	var wrong atomic.Int64
	go func() {
		defer close(done)
		for i := range 200_000 {
			if d := c.Check(fmt.Sprintf("tenant-%06d", 2*(i%900)), "gpt-4o", ""); d.Allowed() {
				wrong.Add(1)
			}
		}
	}()
	until := time.Now().Add(time.Hour)
	quota := func(v int64) map[string]string {
		return map[string]string{flags.VersionField: fmt.Sprint(v),
			"gpt-4o": flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "daily_tokens", Until: until})}
	}
	for v := int64(2); v < 50; v++ {
		updates := map[string]*tenantView{}
		for i := range 900 {
			name := fmt.Sprintf("tenant-%06d", 2*i)
			updates[name] = c.buildView(name, quota(v))
		}
		c.apply(updates, 0, false)
	}
	<-done
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d Checks allowed a tenant whose flag was only being refreshed", n)
	}
	// An older read of a refreshed tenant does not replace the newer view.
	stale := c.buildView("tenant-000000", map[string]string{flags.VersionField: "1", "claude": quota(1)["gpt-4o"]})
	c.apply(map[string]*tenantView{"tenant-000000": stale}, 0, false)
	if d := c.Check("tenant-000000", "gpt-4o", ""); d.Allowed() {
		t.Fatal("an older read replaced a newer view")
	}
	// One apply: a replacement, a new tenant, a tenant whose flags went.
	c.apply(map[string]*tenantView{
		"tenant-000002": c.buildView("tenant-000002", quota(100)),
		"newcomer":      c.buildView("newcomer", quota(100)),
		"tenant-000004": c.buildView("tenant-000004", map[string]string{flags.VersionField: "100"}),
	}, 0, false)
	for tenant, refused := range map[string]bool{"tenant-000002": true, "newcomer": true, "tenant-000004": false, "tenant-000006": true} {
		if d := c.Check(tenant, "gpt-4o", ""); d.Allowed() == refused {
			t.Errorf("%s on gpt-4o: %+v, want refused=%v", tenant, d, refused)
		}
	}
	if got := c.Tenants(); got != 2000 {
		t.Errorf("%d tenants with flags, want 2000 (one new, one gone)", got)
	}
}

// Periodic resyncs of a large flag set are spaced by their own cost: a
// gateway with a million flagged tenants (a resync of tens of seconds)
// must not spend most of its time rereading them.
func TestSlowResyncsAreSpacedOut(t *testing.T) {
	c := newTestChecker(t)
	if got := c.resyncEvery(); got != c.cfg.ResyncInterval {
		t.Fatalf("before any resync: every %v, want resync_interval %v", got, c.cfg.ResyncInterval)
	}
	c.lastResyncNS.Store(int64(100 * time.Millisecond))
	if got := c.resyncEvery(); got != c.cfg.ResyncInterval {
		t.Fatalf("after a fast resync: every %v, want resync_interval %v", got, c.cfg.ResyncInterval)
	}
	c.lastResyncNS.Store(int64(12 * time.Second))
	if got := c.resyncEvery(); got != 240*time.Second {
		t.Fatalf("after a 12 s resync: every %v, want 4m0s (5%% of the time)", got)
	}
}
