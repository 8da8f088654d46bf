package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	_ "time/tzdata" // tenant timezones must resolve on hosts without a zoneinfo database

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// Problem is one thing wrong in a policy file.
type Problem struct {
	File  string
	Line  int
	Field string // dotted path, e.g. tenants.acme.models.gpt-4o.monthly_tokens
	Msg   string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Field, p.Msg)
}

// Error lists every problem found in a policy file.
type Error struct{ Problems []Problem }

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return fmt.Sprintf("policy: %d problem(s):\n  %s", len(lines), strings.Join(lines, "\n  "))
}

// Load reads and parses the policy file at path.
func Load(path string, opts ...Option) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", path, err)
	}
	return Parse(data, path, opts...)
}

type rawPolicy struct {
	Defaults rawTenant            `yaml:"defaults"`
	Plans    map[string]rawTenant `yaml:"plans"`
	Tenants  map[string]rawTenant `yaml:"tenants"`
	Limits   map[string]rawLimit  `yaml:"limits"`
	Prices   []rawPrice           `yaml:"prices"`
	// PriceCatalog, PricesFile and UnpricedPrice: see "Prices".
	PriceCatalog  string            `yaml:"price_catalog"`
	PricesFile    string            `yaml:"prices_file"`
	UnpricedPrice *rawUnpricedPrice `yaml:"unpriced_price"`
	// Upstreams and Fallbacks are the request path in front of each
	// upstream: see upstreams.go.
	Upstreams map[string]rawUpstream `yaml:"upstreams"`
	Fallbacks map[string][]string    `yaml:"fallbacks"`
	Channels  Channels               `yaml:"channels"`
}

type rawTenant struct {
	Plan            string              `yaml:"plan"`
	Organization    string              `yaml:"organization"`
	WeekStart       string              `yaml:"week_start"`
	BillingDay      *int                `yaml:"billing_day"`
	Timezone        string              `yaml:"timezone"`
	Mode            string              `yaml:"mode"`
	FailMode        string              `yaml:"fail_mode"`
	AlertTiers      []int               `yaml:"alert_tiers"`
	Channels        []string            `yaml:"channels"`
	Priority        string              `yaml:"priority"`
	BurstMultiplier *float64            `yaml:"burst_multiplier"`
	MaxModels       *int                `yaml:"max_models"`
	Unpriced        string              `yaml:"unpriced"`
	Budget          *rawBudget          `yaml:"budget"`
	Models          map[string]rawModel `yaml:"models"`
	Limits          map[string]rawLimit `yaml:"limits"`
	Breakers        struct {
		ErrorRatio rawBreaker `yaml:"error_ratio"`
		SlowCall   rawBreaker `yaml:"slow_call"`
	} `yaml:"breakers"`
}

type rawBudget struct {
	Amount   float64 `yaml:"amount"`
	Currency string  `yaml:"currency"`
}

// rawModel's limits are pointers so that a field the file leaves out
// (inherit the defaults' value) differs from one it sets to 0 (remove the
// inherited quota): see the package doc, "Merging".
type rawModel struct {
	MonthlyTokens     *int64 `yaml:"monthly_tokens"`
	DailyTokens       *int64 `yaml:"daily_tokens"`
	HourlyTokens      *int64 `yaml:"hourly_tokens"`
	TokensPerMinute   *int64 `yaml:"tokens_per_minute"`
	RequestsPerMinute *int64 `yaml:"requests_per_minute"`
	Mode              string `yaml:"mode"`
	Count             string `yaml:"count"`
}

type rawBreaker struct {
	Threshold      *float64       `yaml:"threshold"`
	SlowCallMS     *int64         `yaml:"slow_call_ms"`
	MinRequests    *int           `yaml:"min_requests"`
	Window         *time.Duration `yaml:"window"`
	OpenFor        *time.Duration `yaml:"open_for"`
	MaxOpenFor     *time.Duration `yaml:"max_open_for"`
	HalfOpenProbes *int           `yaml:"half_open_probes"`
}

type rawUnpricedPrice struct {
	Currency   string  `yaml:"currency"`
	Prompt     float64 `yaml:"prompt"`
	Completion float64 `yaml:"completion"`
	Cached     float64 `yaml:"cached"`
	// CacheWrite and Reasoning default to Prompt and Completion: see Price.
	CacheWrite *float64 `yaml:"cache_write"`
	Reasoning  *float64 `yaml:"reasoning"`
}

type rawPrice struct {
	Model         string    `yaml:"model"`
	Currency      string    `yaml:"currency"`
	EffectiveFrom time.Time `yaml:"effective_from"`
	Prompt        float64   `yaml:"prompt"`
	Completion    float64   `yaml:"completion"`
	Cached        float64   `yaml:"cached"`
	// CacheWrite and Reasoning default to Prompt and Completion: see Price.
	CacheWrite *float64 `yaml:"cache_write"`
	Reasoning  *float64 `yaml:"reasoning"`
}

// builtin is what a file that says nothing gets.
// weekdays reads week_start.
var weekdays = map[string]time.Weekday{"monday": time.Monday, "tuesday": time.Tuesday, "wednesday": time.Wednesday,
	"thursday": time.Thursday, "friday": time.Friday, "saturday": time.Saturday, "sunday": time.Sunday}

var builtin = Tenant{
	Location:        time.UTC,
	WeekStart:       time.Monday,
	BillingDay:      1,
	Mode:            Hard,
	FailMode:        FailOpen,
	AlertTiers:      DefaultAlertTiers(),
	Channels:        []string{"alertmanager"},
	Priority:        schemas.PriorityNormal,
	BurstMultiplier: 1,
	MaxModels:       DefaultMaxModels,
	Unpriced:        UnpricedFallback,
	Models:          map[string]ModelQuota{},
	Limits:          map[string]Limit{},
	Breakers: Breakers{
		ErrorRatio: BreakerPolicy{Threshold: 0.5, MinRequests: 20, Window: time.Minute, OpenFor: 30 * time.Second, MaxOpenFor: 10 * time.Minute, HalfOpenProbes: 5},
		SlowCall:   BreakerPolicy{Threshold: 0.5, SlowCallMS: 10000, MinRequests: 20, Window: time.Minute, OpenFor: 30 * time.Second, MaxOpenFor: 10 * time.Minute, HalfOpenProbes: 5},
	},
}

// Limits on policy values; each is named in the error that enforces it.
const (
	MaxTenants     = 100000
	MaxTier        = 1000
	MaxBurst       = 100.0
	MaxQuotaTokens = int64(1) << 50
	// MaxMaxModels bounds max_models: beyond it the cap no longer bounds
	// the aggregator's memory in any useful way.
	MaxMaxModels    = 100000
	maxChannelCount = 16
)

var (
	tenantID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
)

// Parse parses and validates a policy document. filename is used in error
// messages only. Every problem is reported, each with its line and field.
func Parse(data []byte, filename string, opts ...Option) (*Policy, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("policy: %s: %w", filename, err)
	}
	var raw rawPolicy
	if err := decodeStrict(data, &raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("policy: %s: %w", filename, err)
	}
	p, err := build(raw, &root, filename, newOptions(opts))
	if err != nil {
		return nil, err
	}
	p.fingerprint = fingerprintOf(data, p.pricesFile.data)
	return p, nil
}

// decodeStrict decodes the first document of data into v, refusing a
// field v does not have.
func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// build validates raw, decoded from a document whose nodes are root, and
// makes the policy of it, without its fingerprint. root only places the
// problems: a nil root gives each line 0.
func build(raw rawPolicy, root *yaml.Node, filename string, o options) (*Policy, error) {
	v := &validator{file: filename, root: root}
	// Upstreams first: the limits scoped by one are checked against them.
	v.upstreamNames = v.upstreams(raw.Upstreams)

	// Layers: builtin <- defaults <- the tenant's plan (or the defaults'
	// plan) <- the tenant.
	rawDefaults := raw.Defaults
	rawDefaults.Plan = ""
	defaults := v.tenant("defaults", rawDefaults, &builtin)
	plans := v.plans(raw.Plans, defaults)
	effDefaults := defaults
	if name := raw.Defaults.Plan; name != "" {
		if pl := plans[name]; pl != nil {
			effDefaults = pl
		} else {
			v.fail("defaults.plan", "plan %q is not defined under plans%s", name, definedPlans(plans))
		}
	}
	p := &Policy{defaults: *effDefaults, tenants: map[string]*Tenant{}, source: filename}
	p.limits = v.limits("limits", raw.Limits, nil, false)
	p.upstreams = v.upstreamNames
	p.fallbacks = v.fallbacks(raw.Fallbacks)
	if len(raw.Tenants) > MaxTenants {
		v.fail("tenants", "has %d tenants, at most %d are allowed", len(raw.Tenants), MaxTenants)
	}
	ids := make([]string, 0, len(raw.Tenants))
	for id := range raw.Tenants {
		ids = append(ids, id)
	}
	sort.Strings(ids) // problems in file order is nicer, but stable order is what matters
	for _, id := range ids {
		if !tenantID.MatchString(id) {
			v.fail("tenants."+id, "tenant id must match %s", tenantID)
			continue
		}
		rt := raw.Tenants[id]
		base := effDefaults
		if rt.Plan != "" {
			if pl := plans[rt.Plan]; pl != nil {
				base = pl
			} else {
				v.fail("tenants."+id+".plan", "plan %q is not defined under plans%s", rt.Plan, definedPlans(plans))
			}
		}
		t := v.tenant("tenants."+id, rt, base)
		t.ID = id
		p.tenants[id] = t
	}
	inline := map[string][]Price{}
	for i, rp := range raw.Prices {
		path := fmt.Sprintf("prices.%d", i)
		if rp.Model == "" {
			v.fail(path+".model", "is required")
		}
		if rp.Currency == "" {
			v.fail(path+".currency", "is required (e.g. USD)")
		}
		if rp.EffectiveFrom.IsZero() {
			v.fail(path+".effective_from", "is required (RFC 3339 time)")
		}
		v.price(path+".prompt", rp.Prompt)
		v.price(path+".completion", rp.Completion)
		v.price(path+".cached", rp.Cached)
		inline[rp.Model] = append(inline[rp.Model], Price{Model: rp.Model, Currency: rp.Currency, EffectiveFrom: rp.EffectiveFrom.UTC(),
			Prompt: rp.Prompt, Completion: rp.Completion, Cached: rp.Cached,
			CacheWrite: v.priceOr(path+".cache_write", rp.CacheWrite, rp.Prompt),
			Reasoning:  v.priceOr(path+".reasoning", rp.Reasoning, rp.Completion)})
	}
	v.sortPrices("prices", inline)
	p.prices, p.pricesFile = v.layeredPrices(raw, filename, inline)
	p.fallback = v.unpricedPrice(raw.UnpricedPrice)
	checked := []*Tenant{defaults}
	for _, name := range sortedKeys(plans) {
		checked = append(checked, plans[name])
	}
	v.channels(p, raw.Channels, o.checkChannel, append(checked, tenantsOf(p)...))
	if len(v.problems) > 0 {
		sort.SliceStable(v.problems, func(i, j int) bool { return v.problems[i].Line < v.problems[j].Line })
		return nil, &Error{Problems: v.problems}
	}
	return p, nil
}

func tenantsOf(p *Policy) []*Tenant {
	out := make([]*Tenant, 0, len(p.tenants))
	for _, id := range p.TenantIDs() {
		out = append(out, p.tenants[id])
	}
	return out
}

type validator struct {
	file     string
	root     *yaml.Node
	problems []Problem
	// upstreamNames are the upstreams the file defines, for the limits
	// scoped by upstream (scope).
	upstreamNames map[string]Upstream
}

func (v *validator) fail(path, format string, args ...any) {
	v.problems = append(v.problems, Problem{File: v.file, Line: v.line(path), Field: path, Msg: fmt.Sprintf(format, args...)})
}

// line finds the line of the deepest node along a dotted path, so a problem
// in a field that is absent points at its parent.
func (v *validator) line(path string) int {
	n := v.root
	if n == nil {
		return 0
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	parts := strings.Split(path, ".")
	for i := 0; i < len(parts); {
		// Keys may contain dots (model "gpt-4.1"): try the longest key first.
		var next *yaml.Node
		j := len(parts)
		for ; j > i; j-- {
			if next = child(n, strings.Join(parts[i:j], ".")); next != nil {
				break
			}
		}
		if next == nil {
			break
		}
		n, line, i = next, next.Line, j
	}
	return line
}

func child(n *yaml.Node, key string) *yaml.Node {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				// Point at the key's line: that is where the reader looks.
				val := *n.Content[i+1]
				val.Line = n.Content[i].Line
				return &val
			}
		}
	case yaml.SequenceNode:
		var idx int
		if _, err := fmt.Sscanf(key, "%d", &idx); err == nil && idx >= 0 && idx < len(n.Content) {
			return n.Content[idx]
		}
	}
	return nil
}

// plans merges each plan over the defaults, once, whether a tenant takes
// it or not, so its problems are reported once, at its own lines.
func (v *validator) plans(raw map[string]rawTenant, defaults *Tenant) map[string]*Tenant {
	out := make(map[string]*Tenant, len(raw))
	for _, name := range sortedKeys(raw) {
		rp := raw[name]
		path := "plans." + name
		if !tenantID.MatchString(name) {
			v.fail(path, "plan name must match %s", tenantID)
		}
		if rp.Plan != "" {
			v.fail(path+".plan", "a plan cannot take another plan")
			rp.Plan = ""
		}
		pl := v.tenant(path, rp, defaults)
		pl.Plan = name
		out[name] = pl
	}
	return out
}

func definedPlans(plans map[string]*Tenant) string {
	if len(plans) == 0 {
		return " (there is no plans section)"
	}
	return " (defined: " + strings.Join(sortedKeys(plans), ", ") + ")"
}

// tenant merges raw over base and validates the result.
func (v *validator) tenant(path string, raw rawTenant, base *Tenant) *Tenant {
	t := *base
	t.Models = map[string]ModelQuota{}
	for k, q := range base.Models {
		t.Models[k] = q
	}
	if raw.Plan != "" {
		t.Plan = raw.Plan
	}
	if raw.WeekStart != "" {
		if d, ok := weekdays[strings.ToLower(raw.WeekStart)]; ok {
			t.WeekStart = d
		} else {
			v.fail(path+".week_start", "%q is not a day of the week (monday … sunday)", raw.WeekStart)
		}
	}
	if raw.BillingDay != nil {
		t.BillingDay = *raw.BillingDay
		if t.BillingDay < 1 || t.BillingDay > 31 {
			v.fail(path+".billing_day", "%d: the day of the month the tenant's months begin on, 1..31 (a month too short for it begins on its last day)", t.BillingDay)
		}
	}
	if raw.Organization != "" {
		t.Organization = raw.Organization
		if len(t.Organization) > admission.MaxValueLen {
			v.fail(path+".organization", "is longer than %d bytes", admission.MaxValueLen)
		}
	}
	if raw.Timezone != "" {
		loc, err := time.LoadLocation(raw.Timezone)
		if err != nil {
			v.fail(path+".timezone", "unknown timezone %q (use an IANA name such as Asia/Shanghai)", raw.Timezone)
		} else {
			t.Location = loc
		}
	}
	if raw.Mode != "" {
		t.Mode = v.mode(path+".mode", raw.Mode)
	}
	oneOf(v, path+".fail_mode", raw.FailMode, &t.FailMode, FailOpen, FailClosed)
	oneOf(v, path+".unpriced", raw.Unpriced, &t.Unpriced, UnpricedFallback, UnpricedRefuse)
	if raw.AlertTiers != nil {
		t.AlertTiers = raw.AlertTiers
		for i, tier := range raw.AlertTiers {
			if tier < 1 || tier > MaxTier {
				v.fail(fmt.Sprintf("%s.alert_tiers.%d", path, i), "tier %d is outside 1..%d (percent of the quota)", tier, MaxTier)
			}
			if i > 0 && tier <= raw.AlertTiers[i-1] {
				v.fail(fmt.Sprintf("%s.alert_tiers.%d", path, i), "tiers must be strictly ascending (%d after %d)", tier, raw.AlertTiers[i-1])
			}
		}
	}
	if raw.Channels != nil {
		t.Channels = raw.Channels
		v.checkRefs(path+".channels", raw.Channels)
	}
	if raw.Priority != "" {
		if !schemas.Priority(raw.Priority).Valid() {
			v.fail(path+".priority", "%q is not one of %s", raw.Priority, schemas.PriorityNames)
		}
		t.Priority = schemas.Priority(raw.Priority)
	}
	if raw.BurstMultiplier != nil {
		if *raw.BurstMultiplier < 1 || *raw.BurstMultiplier > MaxBurst {
			v.fail(path+".burst_multiplier", "%v is outside 1..%v", *raw.BurstMultiplier, MaxBurst)
		}
		t.BurstMultiplier = *raw.BurstMultiplier
	}
	if raw.MaxModels != nil {
		if *raw.MaxModels < 1 || *raw.MaxModels > MaxMaxModels {
			v.fail(path+".max_models", "%d is outside 1..%d (distinct models counted on their own; the rest are counted as model %q)", *raw.MaxModels, MaxMaxModels, OtherModel)
		}
		t.MaxModels = *raw.MaxModels
	}
	if raw.Budget != nil {
		if raw.Budget.Amount <= 0 {
			v.fail(path+".budget.amount", "must be positive, got %v", raw.Budget.Amount)
		}
		if raw.Budget.Currency == "" {
			v.fail(path+".budget.currency", "is required (e.g. USD)")
		}
		t.Budget = &Budget{Amount: raw.Budget.Amount, Currency: raw.Budget.Currency}
	}
	for model, q := range raw.Models {
		t.Models[model] = v.modelQuota(path+".models."+model, model, q, base.Models[model])
	}
	t.Limits = v.limits(path+".limits", raw.Limits, base.Limits, true)
	t.Breakers.ErrorRatio = v.breaker(path+".breakers.error_ratio", raw.Breakers.ErrorRatio, base.Breakers.ErrorRatio)
	t.Breakers.SlowCall = v.breaker(path+".breakers.slow_call", raw.Breakers.SlowCall, base.Breakers.SlowCall)
	return &t
}

// modelQuota lays the file's models.<model> entry q over the inherited
// entry mq, field by field: a tenant that sets only hourly_tokens for "*"
// keeps the defaults' monthly_tokens for "*" (0 removes an inherited
// quota).
func (v *validator) modelQuota(mp, model string, q rawModel, mq ModelQuota) ModelQuota {
	if model == "" || len(model) > 128 {
		v.fail(mp, "model name must be 1..128 bytes")
	}
	for _, f := range []struct {
		kind schemas.QuotaKind
		raw  *int64
		dst  *int64
	}{
		{schemas.QuotaMonthlyTokens, q.MonthlyTokens, &mq.MonthlyTokens},
		{schemas.QuotaDailyTokens, q.DailyTokens, &mq.DailyTokens},
		{schemas.QuotaHourlyTokens, q.HourlyTokens, &mq.HourlyTokens},
		{schemas.QuotaTokensPerMinute, q.TokensPerMinute, &mq.TokensPerMinute},
		{schemas.QuotaRequestsPerMinute, q.RequestsPerMinute, &mq.RequestsPerMinute},
	} {
		if f.raw == nil {
			continue
		}
		if x := *f.raw; x < 0 || x > MaxQuotaTokens {
			v.fail(mp+"."+string(f.kind), "%d is outside 0..%d (0 removes the quota, also one inherited from defaults)", x, MaxQuotaTokens)
		}
		*f.dst = *f.raw
	}
	if q.Mode != "" {
		mq.Mode = v.mode(mp+".mode", q.Mode)
	}
	oneOf(v, mp+".count", q.Count, &mq.Count, CountTotal, CountBilled)
	return mq
}

// oneOf sets *dst to raw when raw is one of allowed and names the choices
// at path when it is none; an empty raw leaves *dst as it is (inherited or
// the default).
func oneOf[T ~string](v *validator, path, raw string, dst *T, allowed ...T) {
	if raw == "" {
		return
	}
	if slices.Contains(allowed, T(raw)) {
		*dst = T(raw)
		return
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	v.fail(path, "%q is not one of %s", raw, strings.Join(names, ", "))
}

func (v *validator) mode(path, s string) Mode {
	switch Mode(s) {
	case Hard, Soft:
		return Mode(s)
	}
	v.fail(path, "%q is not one of hard, soft", s)
	return Hard
}

func (v *validator) breaker(path string, raw rawBreaker, base BreakerPolicy) BreakerPolicy {
	b := base
	if raw.Threshold != nil {
		b.Threshold = *raw.Threshold
	}
	if raw.SlowCallMS != nil {
		b.SlowCallMS = *raw.SlowCallMS
	}
	if raw.MinRequests != nil {
		b.MinRequests = *raw.MinRequests
	}
	if raw.Window != nil {
		b.Window = *raw.Window
	}
	if raw.OpenFor != nil {
		b.OpenFor = *raw.OpenFor
	}
	if raw.MaxOpenFor != nil {
		b.MaxOpenFor = *raw.MaxOpenFor
	}
	if raw.HalfOpenProbes != nil {
		b.HalfOpenProbes = *raw.HalfOpenProbes
	}
	if b.Threshold <= 0 || b.Threshold > 1 {
		v.fail(path+".threshold", "%v is outside (0, 1] (a ratio of calls)", b.Threshold)
	}
	if b.MinRequests < 1 {
		v.fail(path+".min_requests", "%d must be at least 1", b.MinRequests)
	}
	if b.Window < time.Second || b.Window > time.Hour {
		v.fail(path+".window", "%s is outside 1s..1h", b.Window)
	}
	if b.OpenFor < time.Second {
		v.fail(path+".open_for", "%s must be at least 1s", b.OpenFor)
	}
	if b.MaxOpenFor < b.OpenFor {
		v.fail(path+".max_open_for", "%s must be at least open_for (%s)", b.MaxOpenFor, b.OpenFor)
	}
	if b.HalfOpenProbes < 1 || b.HalfOpenProbes > 1000 {
		v.fail(path+".half_open_probes", "%d is outside 1..1000", b.HalfOpenProbes)
	}
	if b.SlowCallMS < 0 {
		v.fail(path+".slow_call_ms", "%d must not be negative", b.SlowCallMS)
	}
	return b
}
