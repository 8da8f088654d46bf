// Package breaker holds the enforcer's state: one breaker per tenant × scope
// (a model, "*" for tenant-wide, or an API key) × kind, the state machines
// that open and close them from signals, admin actions and the clock, and
// the temporary quota overrides. It is pure logic: the caller passes the
// time, so every transition is testable without waiting.
package breaker

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Key identifies one breaker.
type Key struct {
	Tenant string
	// Scope is a model, "*" (every model) or flags.KeyField(apiKeyID).
	Scope string
	Kind  flags.Kind
	// Quota distinguishes the quota breakers of one scope (monthly_tokens,
	// daily_tokens …); empty for other kinds.
	Quota string
}

// Breaker is one open (or half-open) breaker. Closed breakers are deleted.
// It has no wire format of its own: the admin API lists it as
// adminapi.Breaker, so the state machine can change without breaking clients.
type Breaker struct {
	Key
	State  flags.State
	Reason string
	// Until is when the breaker leaves its state by itself: the period end
	// of a quota, the end of a rate window, the expiry of a manual trip or
	// blacklist, the end of open (then half-open) for health breakers.
	Until    time.Time
	OpenedAt time.Time
	// Period, Limit, Used and ResetsAt describe the quota that was hit.
	Period   string
	Limit    float64
	Used     float64
	ResetsAt time.Time
	// Failures counts consecutive failed half-open rounds; the open time
	// doubles with each, up to the policy's MaxOpenFor.
	Failures int
	// Probes is how many requests each Checker lets through while half-open.
	Probes int
	// Actor names the admin who tripped a manual breaker or blacklist.
	Actor string
}

// Override temporarily replaces one quota limit of a tenant × model.
type Override struct {
	Tenant string
	Model  string
	Quota  string
	Limit  float64
	Until  time.Time
	Reason string
	Actor  string
}

type overrideKey struct{ tenant, model, quota string }

// usage is the latest use of one quota the signals reported, so that an
// override set below it applies at once: the aggregator signals only at
// tier crossings, so waiting for the next one would let a tenant already
// past the new limit carry on until its next tier.
type usage struct {
	used      float64
	period    string
	periodEnd time.Time
}

// Table is every breaker and override, safe for concurrent use.
type Table struct {
	mu        sync.Mutex
	breakers  map[string]map[Key]*Breaker // by tenant
	overrides map[overrideKey]*Override
	// usage is the latest use per tenant × model × quota from signals;
	// entries go at their period's end (Tick) or a period_reset.
	usage   map[overrideKey]usage
	overage float64 // soft-quota overage signals seen, for metrics
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{breakers: map[string]map[Key]*Breaker{}, overrides: map[overrideKey]*Override{}, usage: map[overrideKey]usage{}}
}

func (t *Table) put(b *Breaker) {
	m := t.breakers[b.Tenant]
	if m == nil {
		m = map[Key]*Breaker{}
		t.breakers[b.Tenant] = m
	}
	m[b.Key] = b
}

func (t *Table) del(k Key) bool {
	m := t.breakers[k.Tenant]
	if _, ok := m[k]; !ok {
		return false
	}
	delete(m, k)
	if len(m) == 0 {
		delete(t.breakers, k.Tenant)
	}
	return true
}

// Result says what a call changed.
type Result struct {
	// Changed is the tenants whose flags changed.
	Changed []string
	// Note explains an ignored signal or a soft overage, for the log.
	Note string
	// SoftOverage is set when a soft quota was exceeded (recorded, not blocked).
	SoftOverage bool
	// Stale is set when the signal described a window long over (an
	// anomaly read late, e.g. by a new consumer group from the earliest
	// offset) and was ignored.
	Stale bool
}

func changed(tenant string) Result { return Result{Changed: []string{tenant}} }

// Apply folds one signal into the table. tp is the tenant's policy (never
// nil; see policy.Policy.Tenant). Signals are facts about usage; now is the
// enforcer's clock, which times windows and back-off.
func (t *Table) Apply(s *schemas.Signal, tp *policy.Tenant, now time.Time) Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.noteUsage(s, now)
	switch s.Kind {
	case schemas.SignalQuotaExhausted:
		return t.quotaExhausted(s, tp, now)
	case schemas.SignalPeriodReset:
		return t.closeQuota(s.Tenant, s.Model, string(s.Quota))
	case schemas.SignalTierCrossed:
		if s.Direction == schemas.DirectionDown && s.Tier < 100 {
			return t.closeQuota(s.Tenant, s.Model, string(s.Quota))
		}
		if s.Direction == schemas.DirectionUp && s.Tier >= 100 {
			return t.quotaExhausted(s, tp, now)
		}
		return t.checkOverride(s, now)
	case schemas.SignalRateExceeded:
		return t.rateExceeded(s, tp, now)
	case schemas.SignalAnomaly:
		return t.anomaly(s, tp, now)
	}
	return Result{Note: "kind " + string(s.Kind) + " does not drive breakers"}
}

// NoteUsage records the use s reports without acting on it: recovery
// feeds it the quota_state of open periods, so that an override set after
// a restart knows the use it is set against.
func (t *Table) NoteUsage(s *schemas.Signal, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.noteUsage(s, now)
}

// noteUsage remembers the use a period quota's signal reports.
func (t *Table) noteUsage(s *schemas.Signal, now time.Time) {
	if s.Quota == "" {
		return
	}
	k := overrideKey{s.Tenant, s.Model, string(s.Quota)}
	switch s.Kind {
	case schemas.SignalPeriodReset:
		delete(t.usage, k)
	case schemas.SignalTierCrossed, schemas.SignalExhaustionPredicted, schemas.SignalQuotaExhausted:
		if !s.PeriodEnd.IsZero() && !now.Before(s.PeriodEnd) {
			return
		}
		if u, ok := t.usage[k]; ok && u.periodEnd.Equal(s.PeriodEnd) && u.used > s.Used {
			return // an older signal redelivered: use only grows within a period
		}
		t.usage[k] = usage{used: s.Used, period: string(s.Period), periodEnd: s.PeriodEnd}
	}
}

// modeOf is the signal's mode, else the policy's for that quota.
func modeOf(s *schemas.Signal, tp *policy.Tenant) policy.Mode {
	if s.Mode != "" {
		return policy.Mode(s.Mode)
	}
	for _, q := range tp.Quotas(s.Model) {
		if q.Name == s.Quota {
			return q.Mode
		}
	}
	if m := tp.ModeFor(s.Model); m != "" {
		return m
	}
	return policy.Hard
}

func (t *Table) quotaExhausted(s *schemas.Signal, tp *policy.Tenant, now time.Time) Result {
	if !s.PeriodEnd.IsZero() && !now.Before(s.PeriodEnd) {
		return Result{Note: "quota signal for a period already over"}
	}
	if modeOf(s, tp) == policy.Soft {
		// Not blocked: a soft flag, which gateways with fallback models
		// read as "serve a cheaper one", until the period ends.
		t.overage++
		k := Key{Tenant: s.Tenant, Scope: s.Model, Kind: flags.KindQuota, Quota: string(s.Quota)}
		until := s.PeriodEnd
		if until.IsZero() {
			until = now.Add(time.Hour)
		}
		t.put(&Breaker{Key: k, State: flags.StateSoft, Until: until, OpenedAt: now, Period: string(s.Period),
			Limit: s.Limit, Used: s.Used, ResetsAt: s.PeriodEnd,
			Reason: fmt.Sprintf("soft %s quota exceeded: %s of %s %s used (allowed, overage billed)", s.Quota, fmtNum(s.Used), fmtNum(s.Limit), unitOf(s))})
		return Result{SoftOverage: true, Changed: []string{s.Tenant}, Note: "soft quota " + string(s.Quota) + " exceeded: overage recorded, not blocked; soft flag written"}
	}
	if o := t.overrides[overrideKey{s.Tenant, s.Model, string(s.Quota)}]; o != nil && now.Before(o.Until) && s.Used < o.Limit {
		return Result{Note: "quota raised by an override; not blocking"}
	}
	k := Key{Tenant: s.Tenant, Scope: s.Model, Kind: flags.KindQuota, Quota: string(s.Quota)}
	until := s.PeriodEnd
	if until.IsZero() {
		until = now.Add(time.Hour) // no bound given: recheck hourly rather than block forever
	}
	reason := s.Reason
	if reason == "" {
		reason = fmt.Sprintf("%s quota exhausted: %s of %s %s used", s.Quota, fmtNum(s.Used), fmtNum(s.Limit), unitOf(s))
	}
	t.put(&Breaker{Key: k, State: flags.StateOpen, Reason: reason, Until: until, OpenedAt: now,
		Period: string(s.Period), Limit: s.Limit, Used: s.Used, ResetsAt: s.PeriodEnd})
	return changed(s.Tenant)
}

func unitOf(s *schemas.Signal) string {
	if s.Unit == "" {
		return "tokens"
	}
	return string(s.Unit)
}

func fmtNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func (t *Table) closeQuota(tenant, model, quota string) Result {
	closed := false
	for k := range t.breakers[tenant] {
		if k.Kind == flags.KindQuota && k.Scope == model && (quota == "" || k.Quota == quota) {
			closed = t.del(k) || closed
		}
	}
	if !closed {
		return Result{}
	}
	return changed(tenant)
}

// checkOverride opens a quota breaker when usage passes an override that
// lowered the limit below the policy's (the aggregator only signals at the
// policy's limit).
func (t *Table) checkOverride(s *schemas.Signal, now time.Time) Result {
	o := t.overrides[overrideKey{s.Tenant, s.Model, string(s.Quota)}]
	if o == nil || !now.Before(o.Until) || s.Used < o.Limit {
		return Result{}
	}
	k := Key{Tenant: s.Tenant, Scope: s.Model, Kind: flags.KindQuota, Quota: string(s.Quota)}
	until := o.Until
	if !s.PeriodEnd.IsZero() && s.PeriodEnd.Before(until) {
		until = s.PeriodEnd
	}
	t.put(&Breaker{Key: k, State: flags.StateOpen, Until: until, OpenedAt: now, Period: string(s.Period),
		Limit: o.Limit, Used: s.Used, ResetsAt: until,
		Reason: fmt.Sprintf("%s quota exhausted: %s of %s used (temporary limit: %s)", s.Quota, fmtNum(s.Used), fmtNum(o.Limit), o.Reason)})
	return changed(s.Tenant)
}

func (t *Table) rateExceeded(s *schemas.Signal, tp *policy.Tenant, now time.Time) Result {
	if modeOf(s, tp) == policy.Soft {
		t.overage++
		return Result{SoftOverage: true, Note: "soft rate quota exceeded: not throttled"}
	}
	until := s.PeriodEnd
	if until.IsZero() {
		until = s.Time.Add(time.Minute)
	}
	if !now.Before(until) {
		return Result{Note: "rate window already over"}
	}
	k := Key{Tenant: s.Tenant, Scope: s.Model, Kind: flags.KindRate, Quota: string(s.Quota)}
	reason := s.Reason
	if reason == "" {
		reason = fmt.Sprintf("%s exceeded: %s of %s %s in the window", s.Quota, fmtNum(s.Used), fmtNum(s.Limit), unitOf(s))
	}
	t.put(&Breaker{Key: k, State: flags.StateThrottle, Reason: reason, Until: until, OpenedAt: now,
		Period: string(schemas.PeriodMinute), Limit: s.Limit, Used: s.Used, ResetsAt: until})
	return changed(s.Tenant)
}

// anomaly drives the error-ratio and slow-call breakers. The aggregator
// names the detector in Attributes["detector"] ("error_ratio" or
// "slow_call") with the window's Attributes["ratio"] and
// Attributes["requests"]; a verdict on a half-open breaker's probes
// carries Attributes["probe"] as well (see probeVerdict).
func (t *Table) anomaly(s *schemas.Signal, tp *policy.Tenant, now time.Time) Result {
	var kind flags.Kind
	var bp policy.BreakerPolicy
	switch s.Attributes["detector"] {
	case "error_ratio":
		kind, bp = flags.KindErrorRatio, tp.Breakers.ErrorRatio
	case "slow_call":
		kind, bp = flags.KindSlowCall, tp.Breakers.SlowCall
	default:
		return Result{Note: "anomaly without detector error_ratio|slow_call: not a breaker input"}
	}
	ratio, err1 := strconv.ParseFloat(s.Attributes["ratio"], 64)
	requests, err2 := strconv.Atoi(s.Attributes["requests"])
	if err1 != nil || err2 != nil || math.IsNaN(ratio) {
		return Result{Note: "anomaly attributes ratio/requests missing or not numbers"}
	}
	if bp.Threshold <= 0 {
		return Result{Note: "policy has no " + string(kind) + " breaker"}
	}
	if anomalyStale(s, bp, now) {
		return Result{Stale: true, Note: "anomaly of a window long over: ignored"}
	}
	k := Key{Tenant: s.Tenant, Scope: s.Model, Kind: kind}
	b := t.breakers[s.Tenant][k]
	halfOpen := b != nil && b.State == flags.StateHalfOpen
	if verdict := s.Attributes["probe"]; verdict != "" {
		return t.probeVerdict(k, b, bp, verdict, now)
	}
	// A window is a verdict only with min_requests calls in it: a
	// "resolved" over the handful of probes of a half-open round says
	// nothing about them (the probe verdicts do).
	full := requests >= bp.MinRequests
	bad := full && ratio >= bp.Threshold
	switch {
	case bad && b == nil:
		t.put(t.openHealth(k, bp, 0, ratio, requests, now))
		return changed(s.Tenant)
	case bad && halfOpen:
		t.put(t.openHealth(k, bp, b.Failures+1, ratio, requests, now))
		return changed(s.Tenant)
	case !bad && full && halfOpen:
		t.del(k)
		return changed(s.Tenant)
	}
	return Result{}
}

// probeVerdict applies the aggregator's verdict on a half-open breaker's
// probes (Attributes["probe"]): "failed" — any one probe, from any
// gateway — reopens it with a doubled open time; "passed" —
// half_open_probes successful ones in a row — closes it. A breaker that
// is not half-open ignores them: its round is over (a late probe of a
// round already decided) or never began.
func (t *Table) probeVerdict(k Key, b *Breaker, bp policy.BreakerPolicy, verdict string, now time.Time) Result {
	if b == nil || b.State != flags.StateHalfOpen {
		return Result{Note: "probe verdict for a breaker that is not half-open: ignored"}
	}
	switch verdict {
	case "failed":
		nb := t.openHealth(k, bp, b.Failures+1, b.Used, 0, now)
		nb.Reason = fmt.Sprintf("a half-open probe failed; open for %v", nb.Until.Sub(now))
		t.put(nb)
	case "passed":
		t.del(k)
	default:
		return Result{Note: "probe verdict " + strconv.Quote(verdict) + " is neither failed nor passed: ignored"}
	}
	return changed(k.Tenant)
}

// anomalyStale reports whether an anomaly describes a window that ended
// more than one window length before now. Health breakers act on what a
// tenant's calls do now; an anomaly of days ago (a new consumer group
// replaying the topic, a backlog after an outage) must not open a breaker,
// nor close a half-open one. The window is the signal's [PeriodStart,
// PeriodEnd) when it carries one, else the policy's window ending at the
// signal's Time; one window length of grace absorbs consumer lag.
func anomalyStale(s *schemas.Signal, bp policy.BreakerPolicy, now time.Time) bool {
	end, window := s.PeriodEnd, bp.Window
	if end.IsZero() {
		end = s.Time
	} else if !s.PeriodStart.IsZero() && s.PeriodEnd.After(s.PeriodStart) {
		window = s.PeriodEnd.Sub(s.PeriodStart)
	}
	if window <= 0 {
		window = time.Minute
	}
	if end.IsZero() {
		return false // no time at all: nothing tells it is old
	}
	return now.Sub(end) > window
}

func (t *Table) openHealth(k Key, bp policy.BreakerPolicy, failures int, ratio float64, requests int, now time.Time) *Breaker {
	open := bp.OpenFor
	for i := 0; i < failures && open < bp.MaxOpenFor; i++ {
		open *= 2
	}
	if bp.MaxOpenFor > 0 && open > bp.MaxOpenFor {
		open = bp.MaxOpenFor
	}
	if open <= 0 {
		open = 30 * time.Second
	}
	what := "error ratio"
	if k.Kind == flags.KindSlowCall {
		what = "slow-call ratio"
	}
	return &Breaker{Key: k, State: flags.StateOpen, OpenedAt: now, Until: now.Add(open), Failures: failures,
		Probes: bp.HalfOpenProbes, Limit: bp.Threshold, Used: ratio, Period: bp.Window.String(),
		Reason: fmt.Sprintf("%s %.2f over %d requests reached the threshold %.2f; open for %v", what, ratio, requests, bp.Threshold, open)}
}

// Tick moves breakers on with the clock: expired quota, rate, manual and
// blacklist breakers close; open health breakers go half-open for one
// window; half-open ones that saw no bad signal for a window close. Expired
// overrides are dropped. It returns the tenants whose flags changed.
func (t *Table) Tick(now time.Time, tenantPolicy func(string) *policy.Tenant) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for tenant, m := range t.breakers {
		touched := false
		for k, b := range m {
			if now.Before(b.Until) {
				continue
			}
			touched = true
			if (k.Kind == flags.KindErrorRatio || k.Kind == flags.KindSlowCall) && b.State == flags.StateOpen {
				bp := tenantPolicy(tenant).Breakers.ErrorRatio
				if k.Kind == flags.KindSlowCall {
					bp = tenantPolicy(tenant).Breakers.SlowCall
				}
				window := bp.Window
				if window <= 0 {
					window = time.Minute
				}
				nb := *b
				nb.State, nb.Until, nb.Probes = flags.StateHalfOpen, now.Add(window), bp.HalfOpenProbes
				nb.Reason = fmt.Sprintf("half-open: %d probe requests decide (%s)", bp.HalfOpenProbes, b.Reason)
				m[k] = &nb
				continue
			}
			t.del(k)
		}
		if touched {
			out = append(out, tenant)
		}
	}
	for k, u := range t.usage {
		if !u.periodEnd.IsZero() && !now.Before(u.periodEnd) {
			delete(t.usage, k)
		}
	}
	for k, o := range t.overrides {
		if !now.Before(o.Until) {
			delete(t.overrides, k)
			if t.del(Key{Tenant: k.tenant, Scope: k.model, Kind: flags.KindQuota, Quota: k.quota}) {
				out = append(out, k.tenant)
			}
		}
	}
	return out
}

// Trip opens a manual breaker on tenant × scope until until.
func (t *Table) Trip(tenant, scope, reason, actor string, until, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.put(&Breaker{Key: Key{Tenant: tenant, Scope: scope, Kind: flags.KindManual}, State: flags.StateOpen,
		Reason: reason, Until: until, OpenedAt: now, Actor: actor})
}

// Reset closes the breakers of tenant × scope: those of kind, or every kind
// but blacklist when kind is empty. It reports whether any closed.
func (t *Table) Reset(tenant, scope string, kind flags.Kind) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	closed := false
	for k := range t.breakers[tenant] {
		if k.Scope == scope && (k.Kind == kind || (kind == "" && k.Kind != flags.KindBlacklist)) {
			closed = t.del(k) || closed
		}
	}
	return closed
}

// Blacklist blocks tenant (every model) or, when apiKeyID is set, one key.
func (t *Table) Blacklist(tenant, apiKeyID, reason, actor string, until, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.put(&Breaker{Key: Key{Tenant: tenant, Scope: blacklistScope(apiKeyID), Kind: flags.KindBlacklist},
		State: flags.StateBlacklist, Reason: reason, Until: until, OpenedAt: now, Actor: actor})
}

// Unblacklist lifts a blacklist; it reports whether there was one.
func (t *Table) Unblacklist(tenant, apiKeyID string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.del(Key{Tenant: tenant, Scope: blacklistScope(apiKeyID), Kind: flags.KindBlacklist})
}

func blacklistScope(apiKeyID string) string {
	if apiKeyID == "" {
		return flags.AllModels
	}
	return flags.KeyField(apiKeyID)
}

// SetOverride installs a temporary limit. A limit of 0 (a leaked key, a
// tenant to stop now) opens a quota breaker at once, and so does a limit
// at or below the use the signals last reported: an override applies when
// it is set, not at the tenant's next tier crossing. A raised limit closes
// an open quota breaker whose usage is below it.
func (t *Table) SetOverride(o Override, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ok := overrideKey{o.Tenant, o.Model, o.Quota}
	t.overrides[ok] = &o
	k := Key{Tenant: o.Tenant, Scope: o.Model, Kind: flags.KindQuota, Quota: o.Quota}
	b := t.breakers[o.Tenant][k]
	u, known := t.usage[ok]
	if known && !u.periodEnd.IsZero() && !now.Before(u.periodEnd) {
		known = false
	}
	switch {
	case o.Limit == 0:
		t.put(&Breaker{Key: k, State: flags.StateOpen, OpenedAt: now, Until: o.Until, Limit: 0, ResetsAt: o.Until,
			Actor: o.Actor, Reason: fmt.Sprintf("%s set to 0 until %s: %s", o.Quota, o.Until.UTC().Format(time.RFC3339), o.Reason)})
	case known && u.used >= o.Limit:
		until := o.Until
		if !u.periodEnd.IsZero() && u.periodEnd.Before(until) {
			until = u.periodEnd
		}
		t.put(&Breaker{Key: k, State: flags.StateOpen, OpenedAt: now, Until: until, Period: u.period, Limit: o.Limit,
			Used: u.used, ResetsAt: until, Actor: o.Actor,
			Reason: fmt.Sprintf("%s quota exhausted: %s of %s used (temporary limit: %s)", o.Quota, fmtNum(u.used), fmtNum(o.Limit), o.Reason)})
	case b != nil && b.Used < o.Limit:
		t.del(k)
	}
}

// ClearOverride removes an override (and the breaker it opened).
func (t *Table) ClearOverride(tenant, model, quota string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := overrideKey{tenant, model, quota}
	o := t.overrides[k]
	if o == nil {
		return false
	}
	delete(t.overrides, k)
	// The breaker the override opened (its limit is the override's) goes
	// with it; a breaker the policy's own limit opened stays.
	bk := Key{Tenant: tenant, Scope: model, Kind: flags.KindQuota, Quota: quota}
	if b := t.breakers[tenant][bk]; b != nil && b.Limit == o.Limit {
		t.del(bk)
	}
	return true
}

// Overrides lists the overrides of tenant, or of everyone when tenant is "".
func (t *Table) Overrides(tenant string) []Override {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Override
	for k, o := range t.overrides {
		if tenant == "" || k.tenant == tenant {
			out = append(out, *o)
		}
	}
	slices.SortFunc(out, func(a, b Override) int { return cmpStr(a.Tenant+a.Model+a.Quota, b.Tenant+b.Model+b.Quota) })
	return out
}

// Breakers lists the breakers of tenant, or of everyone when tenant is "".
func (t *Table) Breakers(tenant string) []Breaker {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Breaker
	for ten, m := range t.breakers {
		if tenant != "" && ten != tenant {
			continue
		}
		for _, b := range m {
			out = append(out, *b)
		}
	}
	slices.SortFunc(out, func(a, b Breaker) int {
		return cmpStr(a.Tenant+"\x00"+a.Scope+"\x00"+string(a.Kind)+a.Quota, b.Tenant+"\x00"+b.Scope+"\x00"+string(b.Kind)+b.Quota)
	})
	return out
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Tenants returns every tenant with at least one breaker.
func (t *Table) Tenants() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Keys(t.breakers))
}

// Overage returns how many soft-quota overage signals were recorded.
func (t *Table) Overage() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.overage
}

// severity orders kinds when several breakers share a scope: the flag a
// gateway sees is the most severe one.
func severity(b *Breaker) int {
	// A switch, not a map literal: the literal built a map on every call,
	// twice per breaker each time a refresh reads a tenant's flags.
	var s int
	switch b.Kind {
	case flags.KindBlacklist:
		s = 60
	case flags.KindManual:
		s = 50
	case flags.KindQuota:
		s = 40
	case flags.KindRate:
		s = 30
	case flags.KindErrorRatio:
		s = 20
	case flags.KindSlowCall:
		s = 10
	}
	switch b.State {
	case flags.StateHalfOpen:
		s -= 5
	case flags.StateSoft:
		return 0 // refuses nothing: any refusal on the scope wins
	}
	return s
}

// Flags returns the flags of tenant, one per scope (the most severe
// breaker), each with its breaker's own end as Until (zero for none). It
// is not capped by flag_ttl: an unchanged breaker reads the same every
// time, so the writer's refresh renews the keys' expiry without rewriting
// or announcing anything, and a dead enforcer's flags lapse in gateways by
// the heartbeat instead (docs/flags.md, "Heartbeat and staleness").
// RetryAfter stays zero: Until says the same, and a value computed from
// the time of writing would go stale in a flag that is not rewritten.
func (t *Table) Flags(tenant string) map[string]*flags.Flag {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.breakers[tenant]
	if len(m) == 0 {
		return nil
	}
	best := map[string]*Breaker{}
	for _, b := range m {
		if cur := best[b.Scope]; cur == nil || severity(b) > severity(cur) ||
			(severity(b) == severity(cur) && b.Until.After(cur.Until)) {
			best[b.Scope] = b
		}
	}
	out := make(map[string]*flags.Flag, len(best))
	for scope, b := range best {
		out[scope] = &flags.Flag{State: b.State, Kind: b.Kind, Quota: b.Quota, Period: b.Period, Until: b.Until,
			Limit: b.Limit, Used: b.Used, ResetsAt: b.ResetsAt, Probes: b.Probes, Reason: b.Reason}
	}
	return out
}

// Restore puts back a breaker from a flag an earlier enforcer wrote to
// Redis (field is the flag's hash field, written when the enforcer wrote
// it, from the hash's version). The flags in Redis are the enforcement in
// force, so a restarted enforcer takes them as its floor before it writes
// anything: a restart must never lower enforcement, whatever ClickHouse can
// tell it. The breaker's own end is rebuilt from what the flag carries:
// the period end (ResetsAt) of a quota or rate breaker, else write time +
// RetryAfter (what enforcers that capped Until at flag_ttl wrote for
// manual, blacklist and open health breakers), else Until (the breaker's
// own end, as enforcers write it now). A breaker already in the table wins
// (it is newer than Redis); a flag already over is skipped. Only the most
// severe breaker of each scope has a flag, so one hidden under it is not
// restored: it comes back from ClickHouse (quota) or lapses (rate, health).
// Restore reports whether it added a breaker.
func (t *Table) Restore(tenant, field string, f *flags.Flag, written, now time.Time) bool {
	until := f.Until
	switch {
	case !f.ResetsAt.IsZero():
		until = f.ResetsAt
	case f.State != flags.StateHalfOpen && f.RetryAfter > 0:
		until = written.Add(f.RetryAfter)
	}
	if !until.IsZero() && !now.Before(until) {
		return false
	}
	if until.IsZero() {
		until = now.Add(time.Hour) // no bound known: recheck hourly rather than block forever
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := Key{Tenant: tenant, Scope: field, Kind: f.Kind, Quota: f.Quota}
	if _, ok := t.breakers[tenant][k]; ok {
		return false
	}
	t.put(&Breaker{Key: k, State: f.State, Reason: f.Reason, Until: until, OpenedAt: written, Period: f.Period,
		Limit: f.Limit, Used: f.Used, ResetsAt: f.ResetsAt, Probes: f.Probes})
	return true
}
