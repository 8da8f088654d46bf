package policy

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// This file is the policy's side of admission (sdk/go/admission): the
// limits sections, their merge through defaults, plans and tenants, and
// AdmissionRules, which turns the whole into the rules a gateway enforces
// before each call.

// Limit is one admission limit as the policy states it, after merging:
// name, scope, unit and algorithm with its parameters. Rule turns it into
// the admission.Rule a gateway enforces.
type Limit struct {
	Name string
	// Scope is global when empty; see admission.Scope (Each = "*").
	Scope     admission.Scope
	Unit      admission.Unit
	Algorithm admission.Algorithm
	// Token bucket: Rate units per Per; Burst is the capacity, and when
	// BurstSet is false it is Rate × the tenant's burst_multiplier.
	Rate     float64
	Per      time.Duration
	Burst    int64
	BurstSet bool
	// Sliding window: at most Max units in any Length. Calendar period:
	// at most Max units in each Period of the tenant's time zone.
	Length time.Duration
	Max    int64
	Period schemas.Period
	// AnchorDay starts a monthly period on that day of the month (a
	// billing day, 1..31; 0 is the 1st).
	AnchorDay int
	// ExpiresAt ends a one-off period (PeriodOnce): the limit counts from
	// the start until then and no longer applies after.
	ExpiresAt time.Time
	// Exact runs the limit without local leases (money, low limits).
	Exact bool
	// Reserve is the share of the limit only critical and high priority
	// requests may use.
	Reserve float64
	// Wait is, per priority class (schemas.Priority.Index), how long a
	// request the limit refuses may wait for it to admit it; 0 (the
	// default for every class) refuses at once. See admission.Rule.Wait.
	Wait [schemas.NumPriorities]time.Duration
}

// Rule returns the admission rule of l for a tenant whose burst_multiplier
// is burstMultiplier (1 for the top-level limits).
//
// A limit counting cost states its amounts in the price table's currency
// (limit: 50 is 50 USD); the rule counts millionths of it
// (admission.CostScale), the unit the gateway prices calls in.
func (l Limit) Rule(burstMultiplier float64) admission.Rule {
	r := admission.Rule{Name: l.Name, Scope: l.Scope, Unit: l.Unit, Algorithm: l.Algorithm, Exact: l.Exact, Reserve: l.Reserve, Wait: l.Wait}
	scale := int64(1)
	if l.Unit == admission.Cost {
		scale = admission.CostScale
	}
	switch l.Algorithm {
	case admission.TokenBucket:
		r.Rate = l.Rate / l.Per.Seconds() * float64(scale)
		r.Limit = l.Burst * scale
		if !l.BurstSet {
			r.Limit = int64(math.Ceil(l.Rate*max(burstMultiplier, 1))) * scale
		}
	case admission.SlidingWindow:
		r.Window, r.Limit = l.Length, l.Max*scale
	case admission.CalendarPeriod:
		r.Limit, r.Calendar, r.Expires = l.Max*scale, l.calendar(&Tenant{Location: time.UTC, WeekStart: time.Monday}), l.ExpiresAt
	}
	return r
}

// calendar is l's PeriodCalendar in its owner's calendar (zone, first
// weekday, billing day), with the limit's own anchor_day and expiry.
func (l Limit) calendar(owner *Tenant) PeriodCalendar {
	c := owner.Calendar(l.Period)
	if l.AnchorDay != 0 {
		c.AnchorDay = l.AnchorDay // the limit's own billing day
	}
	c.ExpiresAt = l.ExpiresAt
	return c
}

// PeriodWeek is a limit's calendar week (period: {every: week}): in the
// tenant's time zone, from its week_start (Monday, as in ISO 8601, unless
// it says). Only admission counts weekly periods; the pipeline's quotas
// and signals know hours, days and months (schemas.Period).
const PeriodWeek schemas.Period = "week"

// PeriodOnce is a limit's one-off period (period: {every: once,
// expires_at: RFC 3339}): a budget that is not periodic, "a key may spend
// $50 until Friday". It counts from whenever until expires_at, and then
// no longer applies (admission.Rule.Expires); its counters in Redis
// expire with it. Like weeks, only admission knows it.
const PeriodOnce schemas.Period = "once"

// PeriodCalendar is the calendar of a period limit: PeriodBounds of
// Period in Location (the tenant's time zone; UTC for the top-level
// limits, which no tenant owns), its weeks from WeekStart (the tenant's
// first weekday), its months from AnchorDay when set (a billing day); a
// one-off period (PeriodOnce) is one period, from the Unix epoch to
// ExpiresAt, whatever t.
type PeriodCalendar struct {
	Period    schemas.Period
	Location  *time.Location
	WeekStart time.Weekday
	AnchorDay int
	ExpiresAt time.Time
}

// Bounds implements admission.Calendar.
func (c PeriodCalendar) Bounds(t time.Time) (start, end time.Time) {
	switch {
	case c.Period == PeriodOnce:
		// One period whatever t, so that moving expires_at on a reload
		// keeps what was spent (the period's id is its start).
		return time.Unix(0, 0).In(c.ExpiresAt.Location()), c.ExpiresAt
	case c.Period == PeriodWeek:
		return WeekBounds(t, c.Location, c.WeekStart)
	case c.Period == schemas.PeriodMonth && c.AnchorDay > 1:
		return AnchoredMonthBounds(t, c.Location, c.AnchorDay)
	}
	return PeriodBounds(c.Period, t, c.Location)
}

// Limits returns the top-level limits (rules no single tenant owns),
// global ones first, then by name.
func (p *Policy) Limits() []Limit { return sortedLimits(p.limits) }

// LimitList returns the tenant's own limits (its plan's and defaults' after
// merging), by name. Their tenant is implied.
func (t *Tenant) LimitList() []Limit { return sortedLimits(t.Limits) }

func sortedLimits(m map[string]Limit) []Limit {
	out := make([]Limit, 0, len(m))
	for _, l := range m {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool {
		gi, gj := out[i].Scope.Global(), out[j].Scope.Global()
		if gi != gj {
			return gi
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// QuotaRulePrefix starts the names of the rules AdmissionRules derives
// from tokens_per_minute and requests_per_minute quotas.
const QuotaRulePrefix = "quota:"

// AdmissionRules returns the rules gateways enforce before each call: the
// top-level limits, and per tenant (and for tenants the file does not name,
// the defaults) the tenant's limits with their bursts resolved by its
// burst_multiplier, plus its hard tokens_per_minute and requests_per_minute
// quotas as one-minute sliding windows (QuotaRulePrefix + the quota's name,
// + ":" + the model for a per-model quota), and its fail mode.
func (p *Policy) AdmissionRules() *admission.Rules {
	rs := &admission.Rules{Tenants: make(map[string]admission.TenantRules, len(p.tenants))}
	for _, l := range p.Limits() {
		rs.Shared = append(rs.Shared, l.Rule(1))
	}
	for id, t := range p.tenants {
		rs.Tenants[id] = t.admissionRules()
	}
	rs.Default = p.defaults.admissionRules()
	return rs
}

func (t *Tenant) admissionRules() admission.TenantRules {
	tr := admission.TenantRules{FailMode: admission.FailMode(t.FailMode)}
	for _, l := range t.LimitList() {
		r := l.Rule(t.BurstMultiplier)
		if r.Algorithm == admission.CalendarPeriod && t.Location != nil {
			r.Calendar = l.calendar(t)
		}
		tr.Rules = append(tr.Rules, r)
	}
	tr.Rules = append(tr.Rules, t.quotaRules(Hard, QuotaRulePrefix)...)
	return tr
}

// quotaRules returns the tenant's tokens_per_minute and
// requests_per_minute quotas in mode as one-minute sliding windows named
// prefix + the quota (+ ":" + the model for a per-model quota).
func (t *Tenant) quotaRules(mode Mode, prefix string) []admission.Rule {
	var out []admission.Rule
	models := make([]string, 0, len(t.Models))
	for m := range t.Models {
		models = append(models, m)
	}
	slices.Sort(models)
	for _, m := range models {
		q := t.Models[m]
		if t.ModeFor(m) != mode {
			continue
		}
		for _, d := range []struct {
			name  string
			unit  admission.Unit
			limit int64
		}{{"tokens_per_minute", admission.TotalTokens, q.TokensPerMinute}, {"requests_per_minute", admission.Requests, q.RequestsPerMinute}} {
			if d.limit <= 0 {
				continue
			}
			r := admission.Rule{Name: prefix + d.name, Unit: d.unit, Algorithm: admission.SlidingWindow, Limit: d.limit, Window: time.Minute}
			if m != AllModels {
				r.Name += ":" + m
				r.Scope.Model = m
			}
			out = append(out, r)
		}
	}
	return out
}

// SoftRulePrefix starts the names of the rules SoftLimitRules derives
// from soft tokens_per_minute and requests_per_minute quotas.
const SoftRulePrefix = "soft:"

// SoftLimitRules returns, per tenant (and for the defaults), its soft
// tokens_per_minute and requests_per_minute quotas as one-minute sliding
// windows (SoftRulePrefix + the quota, + ":" + the model). A soft quota
// never refuses a request: a gateway that checks these rules serves a
// tenant past one with a cheaper model instead, where the policy names
// fallbacks (see Fallbacks). Every tenant fails open on them.
func (p *Policy) SoftLimitRules() *admission.Rules {
	rs := &admission.Rules{Tenants: make(map[string]admission.TenantRules, len(p.tenants))}
	for id, t := range p.tenants {
		rs.Tenants[id] = admission.TenantRules{FailMode: admission.FailOpen, Rules: t.quotaRules(Soft, SoftRulePrefix)}
	}
	rs.Default = admission.TenantRules{FailMode: admission.FailOpen, Rules: p.defaults.quotaRules(Soft, SoftRulePrefix)}
	return rs
}

// rawLimit's fields are pointers so that a layer (plan, tenant) that
// leaves one out keeps the inherited value: see "Merging" in the package
// doc.
type rawLimit struct {
	Scope         *rawScope  `yaml:"scope"`
	Unit          string     `yaml:"unit"`
	TokenBucket   *rawBucket `yaml:"token_bucket"`
	SlidingWindow *rawWindow `yaml:"sliding_window"`
	Period        *rawPeriod `yaml:"period"`
	Exact         *bool      `yaml:"exact"`
	Reserve       *float64   `yaml:"reserve"`
	// Wait maps priority classes to how long their requests may wait
	// (merged class by class over the inherited limit's).
	Wait     map[string]time.Duration `yaml:"wait"`
	Disabled bool                     `yaml:"disabled"`
}

type rawBucket struct {
	Rate  *float64       `yaml:"rate"`
	Per   *time.Duration `yaml:"per"`
	Burst *int64         `yaml:"burst"`
}

// rawPeriod is a calendar period limit: at most limit units per every
// (hour, day, week or month of the tenant's time zone), or once until
// expires_at (RFC 3339).
type rawPeriod struct {
	Every     *string `yaml:"every"`
	Limit     *int64  `yaml:"limit"`
	AnchorDay *int    `yaml:"anchor_day"`
	ExpiresAt *string `yaml:"expires_at"`
}

type rawWindow struct {
	Length *time.Duration `yaml:"length"`
	Limit  *int64         `yaml:"limit"`
}

// rawScope is "global" or a mapping of dimensions to a value or "*".
type rawScope struct {
	global bool
	dims   map[string]string
	bad    string
}

var scopeDims = []string{"global", "upstream", "tenant", "model", "user", "key", "endpoint", "session", "organization"}

func (s *rawScope) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value != "global" {
			s.bad = fmt.Sprintf("%q is not global or a mapping of %s", n.Value, strings.Join(scopeDims[1:], ", "))
		}
		s.global = true
		return nil
	case yaml.MappingNode:
		s.dims = map[string]string{}
		return n.Decode(&s.dims)
	}
	s.bad = "must be global or a mapping of dimensions"
	return nil
}

// limits merges the raw limits of one layer (path) over base and
// validates what it writes. tenantLevel limits may not name a tenant.
func (v *validator) limits(path string, raw map[string]rawLimit, base map[string]Limit, tenantLevel bool) map[string]Limit {
	out := make(map[string]Limit, len(base)+len(raw))
	for k, l := range base {
		out[k] = l
	}
	names := make([]string, 0, len(raw))
	for name := range raw {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		rl := raw[name]
		lp := path + "." + name
		if name == "" || len(name) > admission.MaxNameBytes {
			v.fail(lp, "limit name must be 1..%d bytes", admission.MaxNameBytes)
		}
		if strings.HasPrefix(name, QuotaRulePrefix) {
			v.fail(lp, "names starting with %q are reserved for the rules derived from tokens_per_minute and requests_per_minute", QuotaRulePrefix)
		}
		if rl.Disabled {
			delete(out, name)
			continue
		}
		l, inherited := out[name]
		l.Name = name
		if rl.Scope != nil {
			l.Scope = v.scope(lp+".scope", rl.Scope, tenantLevel)
		}
		if rl.Unit != "" {
			u, ok := admission.ParseUnit(rl.Unit)
			if !ok {
				v.fail(lp+".unit", "%q is not one of requests, prompt_tokens, completion_tokens, total_tokens, cost", rl.Unit)
			}
			l.Unit = u
		} else if !inherited {
			v.fail(lp+".unit", "is required (requests, prompt_tokens, completion_tokens, total_tokens or cost)")
		}
		switch {
		case rl.TokenBucket != nil && rl.SlidingWindow != nil:
			v.fail(lp, "set token_bucket or sliding_window, not both")
		case rl.Period != nil && (rl.TokenBucket != nil || rl.SlidingWindow != nil):
			v.fail(lp, "set one of token_bucket, sliding_window or period")
		case rl.Period != nil:
			if l.Algorithm != admission.CalendarPeriod && (rl.Period.Every == nil || rl.Period.Limit == nil) {
				v.fail(lp+".period", "needs every (hour, day, week, month, or once with expires_at) and limit")
			}
			if l.Algorithm != admission.CalendarPeriod {
				l.Algorithm, l.Rate, l.Per, l.Burst, l.BurstSet, l.Length, l.Max = admission.CalendarPeriod, 0, 0, 0, false, 0, 0
			}
			if rl.Period.Every != nil {
				l.Period = schemas.Period(*rl.Period.Every)
				if l.Period != PeriodOnce {
					l.ExpiresAt = time.Time{} // an inherited one-off budget made periodic
				}
			}
			if rl.Period.Limit != nil {
				l.Max = *rl.Period.Limit
			}
			if rl.Period.AnchorDay != nil {
				l.AnchorDay = *rl.Period.AnchorDay
			}
			if rl.Period.ExpiresAt != nil {
				at, err := time.Parse(time.RFC3339, *rl.Period.ExpiresAt)
				if err != nil {
					v.fail(lp+".period.expires_at", "%q is not an RFC 3339 time (for example 2026-12-04T18:00:00Z, or with the zone's offset, 2026-12-04T18:00:00+01:00)", *rl.Period.ExpiresAt)
				}
				l.ExpiresAt = at
			}
		case rl.TokenBucket != nil:
			if l.Algorithm != admission.TokenBucket && rl.TokenBucket.Rate == nil {
				v.fail(lp+".token_bucket.rate", "is required (units per per, per defaulting to 1s)")
			}
			if l.Algorithm != admission.TokenBucket {
				l.Algorithm, l.Length, l.Max, l.Period = admission.TokenBucket, 0, 0, ""
				l.Rate, l.Per, l.Burst, l.BurstSet = 0, time.Second, 0, false
			}
			b := rl.TokenBucket
			if b.Rate != nil {
				l.Rate = *b.Rate
			}
			if b.Per != nil {
				l.Per = *b.Per
			}
			if b.Burst != nil {
				l.Burst, l.BurstSet = *b.Burst, true
			}
		case rl.SlidingWindow != nil:
			if l.Algorithm != admission.SlidingWindow && rl.SlidingWindow.Limit == nil {
				v.fail(lp+".sliding_window.limit", "is required (most units in any length; 0 refuses every request)")
			}
			if l.Algorithm != admission.SlidingWindow {
				l.Algorithm, l.Rate, l.Per, l.Burst, l.BurstSet, l.Period = admission.SlidingWindow, 0, 0, 0, false, ""
				l.Length, l.Max = time.Minute, 0
			}
			w := rl.SlidingWindow
			if w.Length != nil {
				l.Length = *w.Length
			}
			if w.Limit != nil {
				l.Max = *w.Limit
			}
		}
		if rl.Exact != nil {
			l.Exact = *rl.Exact
		} else if l.Unit == admission.Cost && !inherited {
			// Money is counted exactly unless the file says otherwise: a
			// lease would let a gateway spend past the budget by its size.
			l.Exact = true
		}
		if rl.Reserve != nil {
			l.Reserve = *rl.Reserve
		}
		v.limitWait(lp+".wait", &l, rl.Wait)
		v.checkLimit(lp, l, rl)
		out[name] = l
	}
	return out
}

// limitWait sets the classes' waits raw names on l.
func (v *validator) limitWait(path string, l *Limit, raw map[string]time.Duration) {
	for _, class := range slices.Sorted(maps.Keys(raw)) {
		p := schemas.Priority(class)
		if !p.Valid() {
			v.fail(path+"."+class, "is not a priority class (%s)", schemas.PriorityNames)
			continue
		}
		d := raw[class]
		if d < 0 || d > admission.MaxRuleWait {
			v.fail(path+"."+class, "%s is outside 0..%s (how long a request of the class may wait for the limit to admit it)", d, admission.MaxRuleWait)
			continue
		}
		l.Wait[p.Index()] = d
	}
}

func (v *validator) scope(path string, rs *rawScope, tenantLevel bool) admission.Scope {
	var s admission.Scope
	if rs.bad != "" {
		v.fail(path, "%s", rs.bad)
		return s
	}
	if rs.global {
		return s
	}
	dims := make([]string, 0, len(rs.dims))
	for d := range rs.dims {
		dims = append(dims, d)
	}
	slices.Sort(dims)
	for _, d := range dims {
		val := rs.dims[d]
		dp := path + "." + d
		if val == "" && d != "global" {
			v.fail(dp, "needs a value, or \"*\" for one counter per value")
			continue
		}
		if len(val) > admission.MaxValueLen {
			v.fail(dp, "value is longer than %d bytes", admission.MaxValueLen)
		}
		switch d {
		case "global":
			if len(rs.dims) > 1 {
				v.fail(dp, "global cannot be combined with other dimensions (leave them out for one global counter)")
			}
		case "upstream":
			s.Upstream = val
			// In a policy that defines upstreams (one `sluice gateway`
			// routes with), the gateway admits an upstream-scoped limit
			// with the upstream it chose for the call: a name that is no
			// upstream — a typo, or a model — would never count a call.
			// Without upstreams the scope is the model (forward-auth).
			if _, ok := v.upstreamNames[val]; len(v.upstreamNames) > 0 && val != admission.Each && !ok {
				v.fail(dp, "%q is no upstream of upstreams (%s); a limit scoped by upstream counts the calls the gateway sends to that upstream, so name one, or \"*\" for each",
					val, strings.Join(sortedKeys(v.upstreamNames), ", "))
			}
		case "tenant":
			if tenantLevel {
				v.fail(dp, "a tenant's, plan's or the defaults' limits count per tenant already; scope.tenant belongs in the top-level limits")
			}
			s.Tenant = val
		case "model":
			s.Model = val
		case "user":
			s.User = val
		case "key":
			s.Key = val
		case "endpoint":
			s.Endpoint = val
		case "session":
			s.Session = val
		case "organization":
			if tenantLevel {
				v.fail(dp, "a tenant belongs to one organization; scope.organization belongs in the top-level limits")
			}
			s.Organization = val
		default:
			v.fail(dp, "unknown dimension (use %s)", strings.Join(scopeDims, ", "))
		}
	}
	return s
}

// checkLimit validates a merged limit; a field the layer did not write is
// reported at the limit's own line.
func (v *validator) checkLimit(lp string, l Limit, rl rawLimit) {
	at := func(field string, written bool) string {
		if written {
			return lp + "." + field
		}
		return lp
	}
	// A cost limit is in currency and counted in millionths of it.
	maxLimit, maxRate := int64(admission.MaxLimit), float64(admission.MaxRate)
	if l.Unit == admission.Cost {
		maxLimit, maxRate = maxLimit/admission.CostScale, maxRate/admission.CostScale
	}
	switch l.Algorithm {
	case admission.TokenBucket:
		b := rl.TokenBucket
		if b == nil {
			b = &rawBucket{}
		}
		if !(l.Rate > 0 && l.Rate <= maxRate) {
			v.fail(at("token_bucket.rate", b.Rate != nil), "rate %v is outside (0, %g] (units per per)", l.Rate, maxRate)
		}
		if l.Per < time.Millisecond || l.Per > admission.MaxWindow {
			v.fail(at("token_bucket.per", b.Per != nil), "per %s is outside 1ms..%s", l.Per, admission.MaxWindow)
		}
		if l.BurstSet && (l.Burst < 0 || l.Burst > maxLimit) {
			v.fail(at("token_bucket.burst", b.Burst != nil), "burst %d is outside 0..%d", l.Burst, maxLimit)
		}
		if !l.BurstSet && l.Rate*MaxBurst > float64(maxLimit) {
			v.fail(at("token_bucket.rate", b.Rate != nil), "rate %v times burst_multiplier may exceed %d; set burst", l.Rate, maxLimit)
		}
	case admission.SlidingWindow:
		w := rl.SlidingWindow
		if w == nil {
			w = &rawWindow{}
		}
		if l.Length < admission.MinWindow || l.Length > admission.MaxWindow {
			v.fail(at("sliding_window.length", w.Length != nil), "length %s is outside %s..%s", l.Length, admission.MinWindow, admission.MaxWindow)
		}
		if l.Max < 0 || l.Max > maxLimit {
			v.fail(at("sliding_window.limit", w.Limit != nil), "limit %d is outside 0..%d", l.Max, maxLimit)
		}
	case admission.CalendarPeriod:
		pr := rl.Period
		if pr == nil {
			pr = &rawPeriod{}
		}
		if l.Period != schemas.PeriodHour && l.Period != schemas.PeriodDay && l.Period != PeriodWeek && l.Period != schemas.PeriodMonth && l.Period != PeriodOnce {
			v.fail(at("period.every", pr.Every != nil), "%q is not hour, day, week, month or once", l.Period)
		}
		switch {
		case l.Period == PeriodOnce && l.ExpiresAt.IsZero() && pr.ExpiresAt == nil:
			v.fail(lp+".period.expires_at", "is required with every: once (RFC 3339: when the one-off budget ends)")
		case l.Period != PeriodOnce && !l.ExpiresAt.IsZero():
			v.fail(at("period.expires_at", pr.ExpiresAt != nil), "only a one-off period (every: once) expires; a periodic one starts again each period")
		}
		if l.AnchorDay != 0 && (l.Period != schemas.PeriodMonth || l.AnchorDay < 1 || l.AnchorDay > 31) {
			v.fail(at("period.anchor_day", pr.AnchorDay != nil), "%d: a monthly period's first day of the month, 1..31 (a month too short for it begins on its last day)", l.AnchorDay)
		}
		if l.Max < 0 || l.Max > maxLimit {
			v.fail(at("period.limit", pr.Limit != nil), "limit %d is outside 0..%d", l.Max, maxLimit)
		}
	default:
		v.fail(lp, "needs token_bucket {rate, per, burst}, sliding_window {length, limit} or period {every, limit}")
	}
	if !(l.Reserve >= 0 && l.Reserve <= admission.MaxReserve) {
		v.fail(at("reserve", rl.Reserve != nil), "%v is outside 0..%v (the share only critical and high priority requests may use)", l.Reserve, admission.MaxReserve)
	}
}
