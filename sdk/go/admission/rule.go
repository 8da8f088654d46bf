package admission

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Unit is what a rule counts.
type Unit uint8

// The units. A request debits 1 request, its estimated prompt tokens, its
// estimated completion tokens, both (total tokens), or its estimated cost
// from every rule that applies to it.
const (
	Requests Unit = iota + 1
	PromptTokens
	CompletionTokens
	TotalTokens
	// Cost counts money in millionths of the price table's currency
	// (CostScale per unit): Request.Cost before the call, Usage.Cost
	// after it.
	Cost
)

// CostScale is how many of Cost's units make one unit of currency.
const CostScale = 1_000_000

var unitNames = [...]string{"", "requests", "prompt_tokens", "completion_tokens", "total_tokens", "cost"}

func (u Unit) String() string {
	if int(u) < len(unitNames) && u > 0 {
		return unitNames[u]
	}
	return fmt.Sprintf("unit(%d)", u)
}

// ParseUnit is the inverse of Unit.String.
func ParseUnit(s string) (Unit, bool) {
	for i, n := range unitNames {
		if i > 0 && n == s {
			return Unit(i), true
		}
	}
	return 0, false
}

// Tokens reports whether u counts tokens (for the -tokens rate-limit headers).
func (u Unit) Tokens() bool { return u == PromptTokens || u == CompletionTokens || u == TotalTokens }

// Algorithm is how a rule spreads its limit over time.
type Algorithm uint8

// The algorithms.
const (
	// TokenBucket starts full at Limit (the burst) and refills at Rate
	// units per second up to Limit.
	TokenBucket Algorithm = iota + 1
	// SlidingWindow admits at most Limit units in any Window; see the
	// package documentation for its granules.
	SlidingWindow
	// CalendarPeriod admits at most Limit units in each period of the
	// rule's Calendar (an hour, a day, a month in the tenant's time
	// zone): one counter per instance and period, whatever the period's
	// length, where a sliding window of a month keeps a granule per
	// 12 hours. It runs exact (no leases).
	CalendarPeriod
)

// Calendar cuts time into a CalendarPeriod rule's periods: Bounds returns
// the period containing t. Package policy's is PeriodBounds in the
// tenant's time zone.
type Calendar interface {
	Bounds(t time.Time) (start, end time.Time)
}

func (a Algorithm) String() string {
	switch a {
	case TokenBucket:
		return "token_bucket"
	case SlidingWindow:
		return "sliding_window"
	case CalendarPeriod:
		return "calendar_period"
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// Each as a Scope dimension gives the rule one counter per distinct value of
// that dimension ("per user"); any other value restricts the rule to requests
// with that value and an empty one leaves the dimension out of the scope.
const Each = "*"

// Scope says which requests a rule counts together. A dimension left empty
// is not part of the scope; a scope with every dimension empty is global
// (one counter for all requests).
//
// In a Decision, Scope holds the values of the refusing rule instance: the
// rule's fixed values and the request's values for its Each dimensions.
type Scope struct {
	// Upstream is the provider account or model the request goes to; a
	// Request without one counts as going to its model.
	Upstream string
	Tenant   string
	Model    string
	User     string
	// Key is the API key id.
	Key      string
	Endpoint string
	// Session is the agent session or conversation (the usage event's
	// session_id); Organization the organisation the tenant belongs to,
	// whose budget caps its tenants together.
	Session      string
	Organization string
}

// numDims is how many dimensions a Scope has.
const numDims = 8

// dims lists the dimensions in their fixed order (the order of instance
// keys and messages), with their short names. New dimensions go last, so
// that the keys of rules without them stay as they were.
func (s *Scope) dims() [numDims]scopeDim {
	return [numDims]scopeDim{{"upstream", &s.Upstream}, {"tenant", &s.Tenant}, {"model", &s.Model}, {"user", &s.User}, {"key", &s.Key}, {"endpoint", &s.Endpoint},
		{"session", &s.Session}, {"organization", &s.Organization}}
}

// scopeDim is one dimension of a Scope: its short name and its field.
type scopeDim struct {
	name string
	v    *string
}

// Global reports whether the scope has no dimension.
func (s Scope) Global() bool { return s == Scope{} }

// String renders the scope as "tenant=acme, user=bob", or "global".
func (s Scope) String() string {
	var b strings.Builder
	for _, d := range s.dims() {
		if *d.v == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(d.name)
		b.WriteByte('=')
		b.WriteString(*d.v)
	}
	if b.Len() == 0 {
		return "global"
	}
	return b.String()
}

// Rule is one admission limit.
type Rule struct {
	// Name identifies the rule in decisions, metrics and Redis keys; it is
	// unique among the shared rules and among one tenant's rules.
	Name  string
	Scope Scope
	Unit  Unit
	// Algorithm is TokenBucket or SlidingWindow.
	Algorithm Algorithm
	// Limit is a window's most units per Window, or a bucket's burst (its
	// capacity). 0 refuses every request the rule applies to.
	Limit int64
	// Window is a sliding window's length.
	Window time.Duration
	// Rate is a bucket's refill in units per second.
	Rate float64
	// Calendar gives a CalendarPeriod rule its periods.
	Calendar Calendar
	// Expires, when set, ends a CalendarPeriod rule: a one-off budget
	// ("$50 until Friday") whose calendar has one period ending at
	// Expires, so its counters expire with it. From Expires on (by the
	// Limiter's clock, WithClock) the rule applies to no request; the
	// others still do.
	Expires time.Time
	// Exact disables local leases for the rule: every admission it applies
	// to is decided by Redis. Use it for low limits and for money.
	Exact bool
	// Reserve is the fraction of Limit that only critical and high
	// priority requests may use (0 ≤ Reserve ≤ MaxReserve).
	Reserve float64
	// Wait is, per priority class (schemas.Priority.Index), how long
	// Limiter.Acquire may hold a request this rule refuses for the rule to
	// admit it (0 ≤ Wait ≤ MaxRuleWait); 0, the default, refuses at once.
	Wait [schemas.NumPriorities]time.Duration
}

// Limits on rule values, each named in the error that enforces it.
const (
	MaxLimit   = int64(1) << 50
	MaxWindow  = 31 * 24 * time.Hour
	MinWindow  = time.Millisecond
	MaxRate    = 1e12
	MaxReserve = 0.9
	// MaxRuleWait bounds Rule.Wait.
	MaxRuleWait  = time.Hour
	MaxNameBytes = 128
	MaxValueLen  = 256
	// MaxRulesPerRequest bounds the rules that may apply to one request.
	MaxRulesPerRequest = 64
	// Granules is how many granules a sliding window is cut into.
	Granules = 60
)

// Validate reports what is wrong with r, naming the field and the limit.
func (r *Rule) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("rule %q: %s: %s", r.Name, field, fmt.Sprintf(format, args...)))
	}
	if r.Name == "" || len(r.Name) > MaxNameBytes {
		bad("name", "must be 1..%d bytes", MaxNameBytes)
	}
	if r.Unit < Requests || r.Unit > Cost {
		bad("unit", "must be requests, prompt_tokens, completion_tokens, total_tokens or cost")
	}
	if r.Limit < 0 || r.Limit > MaxLimit {
		bad("limit", "%d is outside 0..%d", r.Limit, MaxLimit)
	}
	switch r.Algorithm {
	case TokenBucket:
		if !(r.Rate > 0 && r.Rate <= MaxRate) {
			bad("rate", "%v is outside (0, %g] units per second", r.Rate, MaxRate)
		}
	case SlidingWindow:
		if r.Window < MinWindow || r.Window > MaxWindow {
			bad("window", "%s is outside %s..%s", r.Window, MinWindow, MaxWindow)
		}
	case CalendarPeriod:
		if r.Calendar == nil {
			bad("calendar", "a calendar_period rule needs one (its periods)")
		}
	default:
		bad("algorithm", "must be token_bucket, sliding_window or calendar_period")
	}
	if !r.Expires.IsZero() && r.Algorithm != CalendarPeriod {
		bad("expires", "only a calendar_period rule expires (its counters expire with its one period)")
	}
	if !(r.Reserve >= 0 && r.Reserve <= MaxReserve) {
		bad("reserve", "%v is outside 0..%v", r.Reserve, MaxReserve)
	}
	for i, w := range r.Wait {
		if w < 0 || w > MaxRuleWait {
			bad("wait."+string(schemas.Priorities[i]), "%s is outside 0..%s", w, MaxRuleWait)
		}
	}
	for _, d := range r.Scope.dims() {
		if len(*d.v) > MaxValueLen {
			bad("scope."+d.name, "value is longer than %d bytes", MaxValueLen)
		}
	}
	return errors.Join(errs...)
}

// FailMode says what admission does for a tenant when Redis does not answer
// within the bound (WithMaxWait).
type FailMode string

const (
	// FailOpen admits by a local in-memory limiter enforcing the same rules
	// with limits divided by the gateway count (WithGatewayCount); its debits
	// are sent to Redis when it is back.
	FailOpen FailMode = "open"
	// FailClosed refuses, naming the cause (HTTP 503).
	FailClosed FailMode = "closed"
)

// Rules is everything a Limiter enforces.
type Rules struct {
	// Shared are rules no single tenant owns: global, per upstream, per
	// model, per user across tenants, and so on. Their Scope says whom they
	// count.
	Shared []Rule
	// Tenants holds the rules of tenants that have their own; the tenant
	// is implied in the scope of each (Scope.Tenant must be empty or the
	// tenant), so every tenant's "tpm" rule is a counter of its own.
	Tenants map[string]TenantRules
	// Default applies to every tenant not in Tenants, each with counters
	// of its own.
	Default TenantRules
}

// TenantRules is one tenant's rules and fail mode.
type TenantRules struct {
	Rules    []Rule
	FailMode FailMode
}

// Validate checks every rule and the uniqueness of names.
func (rs *Rules) Validate() error {
	var errs []error
	check := func(where string, list []Rule, tenant string) {
		seen := map[string]bool{}
		for i := range list {
			r := &list[i]
			if err := r.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
			if seen[r.Name] {
				errs = append(errs, fmt.Errorf("%s: rule %q: name is used twice", where, r.Name))
			}
			seen[r.Name] = true
			if tenant != "" && r.Scope.Tenant != "" && r.Scope.Tenant != tenant {
				errs = append(errs, fmt.Errorf("%s: rule %q: scope.tenant: %q in the rules of tenant %q (the tenant is implied)", where, r.Name, r.Scope.Tenant, tenant))
			}
		}
	}
	check("shared", rs.Shared, "")
	for id, tr := range rs.Tenants {
		check("tenant "+id, tr.Rules, id)
		if err := checkFailMode(tr.FailMode); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", id, err))
		}
	}
	check("default", rs.Default.Rules, "*")
	if err := checkFailMode(rs.Default.FailMode); err != nil {
		errs = append(errs, fmt.Errorf("default: %w", err))
	}
	return errors.Join(errs...)
}

// activeAt returns the rules of rs that apply at now (those whose Expires
// is not past) and the earliest expiry among them (zero if none expires).
func (rs *Rules) activeAt(now time.Time) (active *Rules, next time.Time) {
	keep := func(list []Rule) []Rule {
		var out []Rule
		for _, r := range list {
			if r.Expires.IsZero() {
				out = append(out, r)
				continue
			}
			if !now.Before(r.Expires) {
				continue
			}
			if next.IsZero() || r.Expires.Before(next) {
				next = r.Expires
			}
			out = append(out, r)
		}
		return out
	}
	active = &Rules{Shared: keep(rs.Shared), Tenants: make(map[string]TenantRules, len(rs.Tenants)),
		Default: TenantRules{Rules: keep(rs.Default.Rules), FailMode: rs.Default.FailMode}}
	for id, tr := range rs.Tenants {
		active.Tenants[id] = TenantRules{Rules: keep(tr.Rules), FailMode: tr.FailMode}
	}
	return active, next
}

func checkFailMode(m FailMode) error {
	switch m {
	case "", FailOpen, FailClosed:
		return nil
	}
	return fmt.Errorf("fail mode %q is not open or closed", m)
}

// rule is a Rule compiled for the hot path.
type rule struct {
	Rule
	shared bool
	kind   string // "b" or "w", the scripts' kind argument
	gran   int64  // window granule, ms
	perMs  float64
	// maxLease is the most units one gateway may hold as a lease of one
	// instance of this rule; 0 runs the rule exact.
	maxLease int64
	// Arguments of the scripts that do not change per request (but a
	// period rule's rate and granule: see args).
	argLimit, argRate, argGran string
	period                     *periodCache // CalendarPeriod only
	m                          *ruleMetrics
}

// periodCache keeps a period rule's current period, so that Bounds runs
// once per period rather than per admission.
type periodCache struct {
	mu         sync.Mutex
	start, end time.Time
	args       [2]string // start and end in Unix ms
	id         int64     // start in Unix ms
}

// args returns the scripts' rate and granule arguments of r at now: a
// period rule's are its current period's id (its start, Unix ms, also
// returned as id) and its end (Unix ms), by the gateway's clock and the
// rule's calendar; the period an admission debited is the one it sent,
// and its refunds go there (Ticket.periods).
func (r *rule) args(now time.Time) (rate, gran string, id int64) {
	if r.period == nil {
		return r.argRate, r.argGran, -1
	}
	c := r.period
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.args[0] == "" || now.Before(c.start) || !now.Before(c.end) {
		c.start, c.end = r.Calendar.Bounds(now)
		c.id = c.start.UnixMilli()
		c.args = [2]string{strconv.FormatInt(c.id, 10), strconv.FormatInt(c.end.UnixMilli(), 10)}
	}
	return c.args[0], c.args[1], c.id
}

// dated reports whether r's refunds go to where they were debited (a
// window's granule, a period), not to the present.
func (r *rule) dated() bool { return r.gran > 0 || r.period != nil }

func compileRule(r Rule, shared bool, leaseFraction float64, m *metrics) *rule {
	c := &rule{Rule: r, shared: shared}
	switch r.Algorithm {
	case TokenBucket:
		c.kind = "b"
		c.perMs = r.Rate / 1000
		c.argRate = formatFloat(c.perMs)
		c.argGran = "0"
	case SlidingWindow:
		c.kind = "w"
		c.gran = max(r.Window.Milliseconds()/Granules, 1)
		c.argRate = fmt.Sprint(r.Window.Milliseconds())
		c.argGran = fmt.Sprint(c.gran)
	case CalendarPeriod:
		c.kind = "p"
		c.period = &periodCache{}
	}
	c.argLimit = fmt.Sprint(r.Limit)
	// A lease is granted under the floor of the request that renewed it,
	// so a rule with a reserve runs exact to keep the reserve exact. A
	// period rule runs exact: a lease could carry units across the
	// period's end.
	if !r.Exact && r.Reserve == 0 && r.Algorithm != CalendarPeriod {
		c.maxLease = int64(math.Floor(float64(r.Limit) * leaseFraction))
		if c.maxLease < minLease {
			c.maxLease = 0
		}
	}
	c.m = m.rule(r.Name)
	return c
}

// minLease is the smallest lease worth holding: below it a rule runs exact.
const minLease = 4

// floor returns the units a request of priority p must leave untouched.
func (r *rule) floor(p schemas.Priority) int64 {
	if r.Reserve == 0 || p.Rank() >= schemas.PriorityHigh.Rank() {
		return 0
	}
	return int64(math.Ceil(r.Reserve * float64(r.Limit)))
}

// appliesTo reports whether the rule counts req (tenant rules were already
// picked by tenant).
func (r *rule) appliesTo(req *Request) bool {
	s := &r.Scope
	return dimMatch(s.Upstream, req.upstream()) && (!r.shared || dimMatch(s.Tenant, req.Tenant)) &&
		dimMatch(s.Model, req.Model) && dimMatch(s.User, req.User) && dimMatch(s.Key, req.Key) &&
		dimMatch(s.Endpoint, req.Endpoint) && dimMatch(s.Session, req.Session) && dimMatch(s.Organization, req.Organization)
}

func dimMatch(rule, v string) bool {
	switch rule {
	case "":
		return true
	case Each:
		return v != ""
	}
	return rule == v
}

// instanceScope returns the scope values of the instance of r that counts
// req: fixed values as they are, Each dimensions filled from req.
func (r *rule) instanceScope(req *Request, tenant string) Scope {
	s := r.Scope
	fill := func(dst *string, v string) {
		if *dst == Each {
			*dst = v
		}
	}
	fill(&s.Upstream, req.upstream())
	fill(&s.Tenant, req.Tenant)
	fill(&s.Model, req.Model)
	fill(&s.User, req.User)
	fill(&s.Key, req.Key)
	fill(&s.Endpoint, req.Endpoint)
	fill(&s.Session, req.Session)
	fill(&s.Organization, req.Organization)
	if !r.shared {
		s.Tenant = tenant
	}
	return s
}

// need returns the units req debits from a rule counting u: at least 1, so
// that an exhausted rule refuses even a request that estimates nothing.
func need(u Unit, a amounts) int64 {
	if u == Requests {
		return 1
	}
	return max(a.of(u), 1)
}

func formatFloat(f float64) string { return fmt.Sprintf("%.17g", f) }
