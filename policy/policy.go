// Package policy is Sluice's quota policy: which tenant may spend how much of
// what (tokens per month, day, hour and minute, requests per minute, a
// currency budget), hard or soft, in which timezone, with which alert tiers,
// alert channels, gateway fail mode and breaker thresholds, plus the price
// table that turns tokens into money, and the admission limits gateways
// check before each call (see "Limits and plans").
//
// The policy is one YAML file (see testdata/example.yaml). Parse reports
// every problem at once, each with file:line and the field path, so an
// operator fixes a broken file in one go. A Watcher reloads the file when it
// changes; a bad reload keeps the previous policy in force.
//
// # Merging
//
// A tenant's settings are laid over its plan's, which are laid over the
// defaults section: builtin, then defaults, then plans.<plan> (the
// tenant's plan:, or else the defaults' plan:), then the tenant. A tenant
// the file does not name gets the defaults (with the defaults' plan, if
// any). At each layer, scalars (timezone, mode, fail_mode, priority,
// burst_multiplier, max_models, plan) replace the inherited value when
// set. Lists (alert_tiers, channels) and the budget replace it whole.
// Breaker settings, model quotas and limits merge field by field:
// models.<key> starts from the inherited models.<key> (same key, "*"
// included) and each quota the layer writes replaces that quota only, so
// a tenant that sets just hourly_tokens for "*" keeps the inherited
// monthly_tokens and tokens_per_minute for "*". To drop an inherited
// quota, write it as 0. A model key nothing inherited has starts empty.
// Each model key stands alone: a tenant's gpt-4o entry does not inherit
// from its own "*" entry (the "*" quotas apply to the sum of all models
// anyway). limits.<name> merges the same way (scope replaces whole; a
// token_bucket or sliding_window block merges field by field with an
// inherited block of the same algorithm and replaces one of the other);
// {disabled: true} drops an inherited limit.
//
// # Billing day
//
// billing_day: 15 (a tenant field, 1 by default) makes every month of the
// tenant run from the 15th at midnight of its time zone: its monthly
// quotas and budget as the aggregator counts, predicts and alerts them,
// the reconciler's month audit (run on the night the month ends), reports
// and its monthly admission limits (unless a limit sets its own
// anchor_day). A month too short for the day begins on its last day.
// Tenant.PeriodBounds is the one place that rule lives.
//
// # Limits and plans
//
// limits (top level) are admission rules no single tenant owns: a
// platform-wide tokens window, a provider account's requests bucket, a
// per-user limit across tenants. defaults.limits, plans.<name>.limits and
// tenants.<id>.limits are a tenant's own rules: every tenant they apply
// to gets counters of its own (the tenant is implied in the scope). A
// limit has a scope (global, or any of upstream — a model or a named
// provider account —, tenant (top level only), model, user, key, endpoint,
// session (the X-Sluice-Session header: an agent session), organization
// (top level only: the organization: a tenant belongs to, so that one
// limit caps an organisation's teams together), each a value or "*" for
// one counter per distinct value), a unit (requests, prompt_tokens,
// completion_tokens, total_tokens, or cost: money in the price table's
// currency, each call debited its worst case at the model's price before
// it is made, exact unless the file says otherwise) and one algorithm: token_bucket {rate, per (default 1s), burst},
// sliding_window {length, limit} or period {every: hour|day|week|month,
// limit} (at most limit units in each period of the tenant's time zone,
// one counter per scope and period: with scope {user: "*"} a per-user
// monthly quota whose Redis state does not grow with the month's
// traffic; weeks begin on the tenant's week_start, Monday by default, and
// a month on the tenant's billing_day, or the limit's own anchor_day:
// 15 makes a month run from the 15th), or period {every: once, limit,
// expires_at: RFC 3339} (a one-off budget: one period until expires_at,
// after which the limit no longer applies and its Redis counter is gone;
// PeriodOnce). A
// rolling budget of N days is a sliding_window of that length (168h for
// seven days, up to 31 days). A bucket without burst gets rate ×
// burst_multiplier of the tenant it belongs to (1 at top level): that is
// what burst_multiplier does. exact: true takes no local lease; reserve is
// the share of the limit only critical and high priority requests may use;
// wait maps priority classes to how long a request of the class that the
// limit refuses may wait for it to admit it (at most admission.MaxRuleWait;
// every class refuses at once unless named, merged class by class), which
// suits batch traffic (low) and not interactive traffic, which a 429 with
// Retry-After serves better.
// AdmissionRules turns the policy into the rules of sdk/go/admission,
// adding each tenant's hard tokens_per_minute and requests_per_minute
// quotas as one-minute sliding windows so that the request path enforces
// them too.
//
// plans are templates: any tenant field (quotas, limits, burst_multiplier,
// fail_mode, breakers, ...) may appear in a plan, a tenant takes one with
// plan:, and its own values override the plan's as above. A plan cannot
// take another plan, and naming a plan the file does not define is an
// error.
//
// # Model cardinality
//
// max_models (default DefaultMaxModels) caps the distinct models the
// aggregator counts on their own for a tenant: a gateway that passes its
// clients' "model" through could otherwise let one end user create a
// series, ClickHouse rows and breakers per made-up name. Models the
// tenant's policy names under models always count on their own and count
// toward the cap. Beyond the cap, a new model's usage is counted as model
// OtherModel ("other"): its per-model rows (usage_minute, quota_state),
// rates, anomalies and signals are those of "other", while the tenant's "*"
// totals, and so every tenant-wide quota, tier, budget and breaker, stay
// exact, priced at the real model's price. A per-model breaker that opens
// for "other" refuses none of the folded models (gateways check the real
// name); the tenant-wide ones still do. The raw events keep the real model
// names, and the reconciler credits models without counter rows of their
// own to "other".
//
// # Prices
//
// Costs come from three layers of prices, per model and date
// (effective_from): the built-in catalog (prices/catalog.yaml: public list
// prices, dated and with their sources named; price_catalog: none leaves
// it out), then the catalog-format file prices_file names (relative to
// the policy file; `sluicectl prices import` writes it, and the Watcher
// reloads the policy when it changes), then the policy's own prices:
// section. The one precedence rule: per model, the highest layer that
// names the model prices it alone — all of that layer's dated entries
// for the model replace all of the lower layers' — and models it does not
// name keep the lower layers' prices. So a contract price in prices:
// overrides the catalog's list price, and a model the catalog lacks is
// added by naming it.
//
// Each token type of an event is charged at its own price (Price.Cost):
// input (prompt tokens neither read from nor written to the cache),
// cached input read, cache write, output (completion tokens that are not
// reasoning) and reasoning. An entry that leaves cache_write out bills
// cache writes at its input price and one that leaves reasoning out bills
// reasoning at its output price, as the providers do when they do not
// bill them apart; the catalog's cached_input defaults to input too,
// while the prices: section's cached defaults to 0.
//
// A model without a price in force is counted at unpriced_price (0 when
// the file sets none), and the aggregator raises an alert once per model
// where money is counted (a tenant with a budget, or unpriced_price set).
// unpriced (defaults, plans, tenants; default fallback) decides the
// request path: fallback serves the call; refuse has the gateway refuse
// calls of unpriced models for tenants with a budget (UnpricedRefusal).
// Reports list unpriced usage on lines of their own (currency
// "(unpriced)").
//
// # Billed-equivalent tokens
//
// A token quota counts prompt plus completion tokens by default (count:
// total). With count: billed on a models.<key> entry (merged like mode),
// the entry's hourly_tokens, daily_tokens and monthly_tokens count
// billed-equivalent tokens instead: each token type weighted by its
// price relative to the model's input price in force at the event
// (Price.BilledTokens) — a cache read at 0.1 of input counts 0.1, a
// cache write at 1.25 counts 1.25, an output token at 4 counts 4. So a
// quota of a million billed tokens is what a million uncached input
// tokens would cost, whatever the mix. A model without an input price
// (unpriced, without an unpriced_price) counts its total tokens.
// tokens_per_minute always counts total tokens: it is a rate of traffic,
// checked on the request path too. The aggregator counts, the reconciler
// audits and quota_state records billed quotas in billed-equivalent
// tokens (unit tokens); the exhaustion prediction runs on the token rate
// scaled by the period's billed-to-total ratio.
//
// # Periods and timezones
//
// Hourly, daily and monthly quotas (and the budget, per month) run over
// periods of the tenant's timezone, which PeriodBounds computes for the
// aggregator, the reconciler and the read model alike. Across a DST or
// other offset change: an hour is real elapsed time, at most 60 minutes,
// starting on the local whole hour — New York's fall-back has two 01:00
// hours of 60 minutes each, its spring-forward goes from 01:00 EST to
// 03:00 EDT; only a change by other than whole hours or at other than a
// whole local hour (Lord Howe's 30 minutes) leaves a shorter hour. A day
// and a month are the local calendar's: a DST day is 23 or 25 hours, and
// a day whose midnight does not exist (Santiago, Havana) starts at the
// change.
//
// Lookups are read-only after Parse: a *Policy is immutable and safe for
// concurrent use, which is what lets the Watcher swap it atomically.
package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"sort"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Mode says what happens at 100% of a quota; it is the signal contract's
// mode, so a policy value travels into signals unchanged.
type Mode = schemas.Mode

const (
	// Hard blocks the tenant (a breaker opens) until the period ends.
	Hard = schemas.ModeHard
	// Soft lets requests through and records the overage for billing.
	Soft = schemas.ModeSoft
)

// FailMode says what a gateway does for a tenant when its view of the flags
// is too old to trust (Sluice unreachable).
type FailMode string

const (
	// FailOpen serves the tenant: an outage of Sluice is not an outage of the gateway.
	FailOpen FailMode = "open"
	// FailClosed refuses the tenant: for tenants whose spend must never run unchecked.
	FailClosed FailMode = "closed"
)

// AllModels is the model key of tenant-wide quotas and aggregates.
const AllModels = "*"

// OtherModel is the model the aggregator counts a tenant's usage of models
// beyond its max_models under (see "Model cardinality").
const OtherModel = "other"

// DefaultMaxModels is max_models when the policy file does not set it.
const DefaultMaxModels = 500

// Policy is a parsed, validated policy file. It is immutable.
type Policy struct {
	defaults Tenant
	tenants  map[string]*Tenant
	limits   map[string]Limit
	// upstreams and fallbacks: see upstreams.go.
	upstreams map[string]Upstream
	fallbacks map[string][]string
	prices    map[string][]Price // by model, ordered by EffectiveFrom; see "Prices"
	// pricesFile is the prices_file the prices came from, if any.
	pricesFile pricesFile
	// fallback is unpriced_price, nil when the file sets none.
	fallback *Price
	channels Channels
	source   string
	// fingerprint: see Fingerprint.
	fingerprint string
}

// Tenant is one tenant's effective policy: its own settings over the defaults.
type Tenant struct {
	ID   string
	Plan string
	// Organization is the organisation the tenant (a team) belongs to:
	// limits scoped by organization count its tenants together.
	Organization string
	// WeekStart is the first day of the tenant's weeks (week_start;
	// Monday, as in ISO 8601, by default).
	WeekStart time.Weekday
	// BillingDay is the day of the month the tenant's months begin on
	// (billing_day; 1, the calendar month, by default): its monthly
	// quotas, budget, month limits and reports count from it. A month too
	// short for it begins on its last day.
	BillingDay      int
	Location        *time.Location
	Mode            Mode
	FailMode        FailMode
	AlertTiers      []int
	Channels        []string
	Priority        schemas.Priority
	BurstMultiplier float64
	// MaxModels is how many distinct models are counted on their own; see
	// "Model cardinality".
	MaxModels int
	// Unpriced is what the gateway does with a call of a model without a
	// price; see "Prices".
	Unpriced UnpricedAction
	Budget   *Budget
	Models   map[string]ModelQuota
	// Limits are the tenant's admission limits by name, merged from the
	// defaults and its plan (see LimitList and Policy.AdmissionRules).
	Limits   map[string]Limit
	Breakers Breakers
}

// Calendar is the calendar the tenant counts period in: its time zone,
// its first weekday and, for months, its billing day.
func (t *Tenant) Calendar(period schemas.Period) PeriodCalendar {
	c := PeriodCalendar{Period: period, Location: t.Location, WeekStart: t.WeekStart}
	if c.Location == nil {
		c.Location = time.UTC
	}
	if period == schemas.PeriodMonth {
		c.AnchorDay = t.BillingDay
	}
	return c
}

// PeriodBounds is the period of the tenant's calendar that contains at:
// what every counter of the tenant's quotas, its reconciliation and its
// reports take as the period's bounds.
func (t *Tenant) PeriodBounds(period schemas.Period, at time.Time) (start, end time.Time) {
	return t.Calendar(period).Bounds(at)
}

// Budget is a currency budget per month (from the tenant's billing day)
// in the tenant's timezone.
type Budget struct {
	Amount   float64
	Currency string
}

// ModelQuota holds the limits for one model of a tenant (or "*" for all
// models together). Zero means "no such quota".
type ModelQuota struct {
	MonthlyTokens     int64
	DailyTokens       int64
	HourlyTokens      int64
	TokensPerMinute   int64
	RequestsPerMinute int64
	// Mode overrides the tenant's mode for this model; empty inherits it.
	Mode Mode
	// Count is what the hourly, daily and monthly token quotas of the
	// entry count; empty is CountTotal. See "Billed-equivalent tokens".
	Count TokenCount
}

// TokenCount is what a token quota counts.
type TokenCount string

const (
	// CountTotal counts prompt plus completion tokens, whatever their
	// type (UsageEvent.TotalTokens). The default.
	CountTotal TokenCount = "total"
	// CountBilled counts billed-equivalent tokens: each token type
	// weighted by its price relative to the model's input price
	// (Price.BilledTokens).
	CountBilled TokenCount = "billed"
)

// Breakers holds the thresholds of the health breakers a tenant gets.
type Breakers struct {
	ErrorRatio BreakerPolicy
	SlowCall   BreakerPolicy
}

// BreakerPolicy configures an error-ratio or slow-call breaker: it opens when
// at least MinRequests calls in Window have a bad ratio of at least
// Threshold, stays open OpenFor (doubling on each failed probe, up to
// MaxOpenFor), then lets HalfOpenProbes calls through to decide.
type BreakerPolicy struct {
	Threshold      float64
	SlowCallMS     int64
	MinRequests    int
	Window         time.Duration
	OpenFor        time.Duration
	MaxOpenFor     time.Duration
	HalfOpenProbes int
}

// Quota is one limit that applies to a tenant x model key.
// Its kind, period and unit come from schemas.QuotaKind, the one table of
// quota kinds.
type Quota struct {
	Name   schemas.QuotaKind
	Period schemas.Period
	Limit  float64
	Unit   schemas.Unit
	Mode   Mode
	// Billed: the quota counts billed-equivalent tokens (CountBilled);
	// only hourly, daily and monthly token quotas do.
	Billed bool
}

// Price is a model's price per million tokens from EffectiveFrom on, one
// figure per token type of usage event v1.
type Price struct {
	Model         string
	Currency      string
	EffectiveFrom time.Time
	// Prompt prices uncached input tokens and Completion output tokens
	// other than reasoning.
	Prompt     float64
	Completion float64
	// Cached prices input tokens read from the provider's prompt cache.
	Cached float64
	// CacheWrite prices input tokens written to the provider's cache and
	// Reasoning the output tokens a model spent reasoning. A catalog or
	// policy entry that leaves them out bills them as the provider does
	// then: cache writes at Prompt, reasoning at Completion.
	CacheWrite float64
	Reasoning  float64
}

// Tokens are one event's token counts by type, as usage event v1 carries
// them: Cached and CacheWrite are parts of Prompt, Reasoning a part of
// Completion (see schemas.UsageEvent).
type Tokens struct {
	Prompt, Completion, Cached, CacheWrite, Reasoning int64
}

// TokensOf returns the token counts of ev.
func TokensOf(ev *schemas.UsageEvent) Tokens {
	return Tokens{Prompt: ev.PromptTokens, Completion: ev.CompletionTokens, Cached: ev.CachedTokens,
		CacheWrite: ev.CacheWriteTokens, Reasoning: ev.ReasoningTokens}
}

// Split returns the disjoint parts of t that the price types apply to:
// input (uncached, unwritten prompt tokens), cached reads, cache writes,
// output (completion less reasoning) and reasoning. A part never exceeds
// what contains it — cached tokens at most the prompt tokens, cache
// writes at most what the reads leave, reasoning at most the completion —
// so a stored row is priced the same way whatever wrote it (the schema
// rejects more).
func (t Tokens) Split() (input, cached, write, output, reasoning int64) {
	cached = min(t.Cached, t.Prompt)
	write = min(t.CacheWrite, t.Prompt-cached)
	reasoning = min(t.Reasoning, t.Completion)
	return t.Prompt - cached - write, cached, write, t.Completion - reasoning, reasoning
}

// Cost returns the price of t: each token type at its own price per
// million (see Tokens.Split).
//
// This is the one Go price formula: the aggregator's costs and budgets
// use it, and the SQL of the reports and of the reconciler's audit (the
// usage_priced view of migration 053 and services/reconciler/costquery)
// computes the same figure, in the same order of operations, which
// TestViewCostEqualsPriceCost in costquery checks on ClickHouse.
func (p Price) Cost(t Tokens) float64 {
	input, cached, write, output, reasoning := t.Split()
	return (float64(input)*p.Prompt + float64(cached)*p.Cached + float64(write)*p.CacheWrite +
		float64(output)*p.Completion + float64(reasoning)*p.Reasoning) / 1e6
}

// BilledTokens returns t in billed-equivalent tokens: each token type
// weighted by its price relative to the input price, which is Cost over
// the input price per token. A price without an input price (an unpriced
// model without unpriced_price, a free model) has no weights: t counts
// its total tokens. See "Billed-equivalent tokens".
func (p Price) BilledTokens(t Tokens) float64 {
	if !(p.Prompt > 0) {
		return float64(t.Prompt + t.Completion)
	}
	return p.Cost(t) * 1e6 / p.Prompt
}

// Channels holds the alert channel definitions by kind, then by name:
// channels.<kind>.<name> in the file, which tenants reference as
// <kind>:<name> (dingtalk:ops). The policy knows no kinds: which kinds
// exist and what their settings mean is the alerter's business (see
// WithChannelCheck), so a new kind needs no change here.
type Channels map[string]map[string]ChannelSettings

// ChannelSettings are one channel's settings as the file spells them, for
// example webhook and secret. Values are strings; a kind that wants a list
// or a number parses it.
type ChannelSettings map[string]string

// clone returns a deep copy, so that no caller can change an immutable
// Policy through the maps it was handed.
func (c Channels) clone() Channels {
	out := make(Channels, len(c))
	for kind, defs := range c {
		out[kind] = make(map[string]ChannelSettings, len(defs))
		for name, s := range defs {
			out[kind][name] = maps.Clone(s)
		}
	}
	return out
}

// Source names the file the policy came from.
func (p *Policy) Source() string { return p.source }

// Fingerprint identifies the policy document: the hex SHA-256 of the bytes
// parsed. State computed under one policy (the aggregator's snapshots) is
// only reused under a policy with the same fingerprint.
func (p *Policy) Fingerprint() string { return p.fingerprint }

// fingerprintOf hashes the policy document and the prices file it names:
// a new price changes costs, so state kept under the old prices must not
// be reused.
func fingerprintOf(data, prices []byte) string {
	h := sha256.New()
	h.Write(data)
	if prices != nil {
		h.Write([]byte{0})
		h.Write(prices)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// OrganizationOf is the organization tenant id belongs to (the defaults'
// for a tenant the file does not name); empty for none or a nil p. It
// copies nothing: admission asks it on every call.
func (p *Policy) OrganizationOf(id string) string {
	if p == nil {
		return ""
	}
	if t, ok := p.tenants[id]; ok {
		return t.Organization
	}
	return p.defaults.Organization
}

// Tenant returns the effective policy of a tenant. It is never nil: a tenant
// the file does not name gets the defaults, so a new customer is metered
// from its first event.
func (p *Policy) Tenant(id string) *Tenant {
	if t, ok := p.tenants[id]; ok {
		return t
	}
	t := p.defaults
	t.ID = id
	return &t
}

// TenantIDs returns the tenants the file names, sorted.
func (p *Policy) TenantIDs() []string {
	ids := make([]string, 0, len(p.tenants))
	for id := range p.tenants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// AlertTiers lists, ascending, every alert tier some tenant of the file
// (or the defaults, for tenants it does not name) uses: what a view that
// filters quotas by tier offers. A nil p has the built-in tiers.
func (p *Policy) AlertTiers() []int {
	if p == nil {
		return DefaultAlertTiers()
	}
	seen := map[int]bool{}
	for _, t := range p.defaults.AlertTiers {
		seen[t] = true
	}
	for _, t := range p.tenants {
		for _, tier := range t.AlertTiers {
			seen[tier] = true
		}
	}
	out := make([]int, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Ints(out)
	return out
}

// Channels returns the alert channel definitions, a copy the caller may
// keep or change.
func (p *Policy) Channels() Channels { return p.channels.clone() }

// Price returns the price of model in force at time at: the latest entry
// whose EffectiveFrom is not after at.
func (p *Policy) Price(model string, at time.Time) (Price, bool) {
	pr, ok, _, _ := p.PriceSpan(model, at.Unix())
	return pr, ok
}

// PriceSpan is the one price lookup: the price of model in force at ts
// (Unix seconds), and the span [from, until) of seconds over which that
// answer holds, so that a caller pricing many events may keep it until an
// event falls outside. ok is false when no price is in force at ts; from
// and until then bound the span without one. A nil p has no prices.
func (p *Policy) PriceSpan(model string, ts int64) (pr Price, ok bool, from, until int64) {
	from, until = math.MinInt64, math.MaxInt64
	if p == nil {
		return Price{}, false, from, until
	}
	list := p.prices[model]
	i := sort.Search(len(list), func(i int) bool { return list[i].EffectiveFrom.Unix() > ts })
	if i < len(list) {
		until = list[i].EffectiveFrom.Unix()
	}
	if i == 0 {
		return Price{}, false, from, until
	}
	return list[i-1], true, list[i-1].EffectiveFrom.Unix(), until
}

// Prices returns every price entry, by model then date.
func (p *Policy) Prices() []Price { return sortedPrices(p.prices) }

// ModeFor returns the mode that applies to model: the model's own, else the
// tenant's.
func (t *Tenant) ModeFor(model string) Mode {
	if q, ok := t.Models[model]; ok && q.Mode != "" {
		return q.Mode
	}
	return t.Mode
}

// Quotas lists every quota that applies to the tenant x model key, model
// "*" meaning the tenant-wide aggregate. The budget applies to "*" only.
func (t *Tenant) Quotas(model string) []Quota {
	q, ok := t.Models[model]
	var out []Quota
	if ok {
		mode := t.ModeFor(model)
		add := func(kind schemas.QuotaKind, limit int64) {
			if limit > 0 {
				billed := q.Count == CountBilled && kind.Unit() == schemas.UnitTokens && kind.Period() != schemas.PeriodMinute
				out = append(out, Quota{Name: kind, Period: kind.Period(), Limit: float64(limit), Unit: kind.Unit(), Mode: mode, Billed: billed})
			}
		}
		add(schemas.QuotaMonthlyTokens, q.MonthlyTokens)
		add(schemas.QuotaDailyTokens, q.DailyTokens)
		add(schemas.QuotaHourlyTokens, q.HourlyTokens)
		add(schemas.QuotaTokensPerMinute, q.TokensPerMinute)
		add(schemas.QuotaRequestsPerMinute, q.RequestsPerMinute)
	}
	if model == AllModels && t.Budget != nil && t.Budget.Amount > 0 {
		k := schemas.QuotaBudget
		out = append(out, Quota{Name: k, Period: k.Period(), Limit: t.Budget.Amount, Unit: k.Unit(), Mode: t.ModeFor(AllModels)})
	}
	return out
}

// PeriodBounds returns the period containing t in loc: [start, end) with
// start ≤ t < end. Consecutive periods are contiguous and never overlap, in
// every zone of the tz database and across every offset change (a test
// walks them all). What a period is across a change:
//
//   - minute: the UTC minute (every zone in use has a whole-minute offset,
//     so it is also the local minute).
//   - hour: real elapsed time, never more than 60 minutes, starting where
//     the local clock shows a whole hour. When the clock moves, the hour
//     in which it moves ends at the change: New York's fall-back has two
//     01:00 hours, each 60 real minutes (EDT, then EST), and its
//     spring-forward goes from the 01:00 EST hour straight to the 03:00
//     EDT hour; a change that is not a whole number of hours or does not
//     fall on a whole local hour (Lord Howe's 30 minutes) leaves one
//     shorter hour on each side. Two real hours never count against one
//     hourly quota.
//   - day: the local calendar day, from the first instant the local clock
//     shows that date to the first instant it shows the next one, so a
//     DST day is 23 or 25 hours, and a day whose midnight is skipped
//     (Santiago, Havana) starts at the change (01:00). A fall-back that
//     takes the clock back across midnight keeps the repeated stretch in
//     the later day: a day never restarts.
//   - month: likewise, from the first instant of the 1st to the first
//     instant of the next month's 1st, in the local calendar.
//
// time.Date is not used for the bounds: on an ambiguous or skipped local
// time its choice of offset is unspecified, which put periods entirely
// before or after the instant they were asked for.
func PeriodBounds(period schemas.Period, t time.Time, loc *time.Location) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	switch period {
	case schemas.PeriodMinute:
		start = t.Truncate(time.Minute)
		return start.In(loc), start.Add(time.Minute).In(loc)
	case schemas.PeriodHour:
		return clockBounds(t, loc, time.Hour)
	case schemas.PeriodDay, schemas.PeriodMonth:
		return calendarBounds(period, t, loc)
	case PeriodWeek:
		return WeekBounds(t, loc, time.Monday)
	}
	panic(fmt.Sprintf("policy: unknown period %q", period))
}

// maxZoneWalk bounds how many zone changes the period functions step over
// in one window; no zone changes more than a few times a month.
const maxZoneWalk = 64

// maxOffset bounds any UTC offset the tz database has (±15:56 in history):
// an instant at which the local clock shows w lies within maxOffset of w
// read as UTC.
const maxOffset = 26 * time.Hour

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func offsetAt(u time.Time, loc *time.Location) int {
	_, off := u.In(loc).Zone()
	return off
}

// wallOf returns what loc's clock shows at u, as a UTC time.
func wallOf(u time.Time, loc *time.Location) time.Time {
	return u.UTC().Add(time.Duration(offsetAt(u, loc)) * time.Second)
}

// offsetRun is a stretch of time during which loc's UTC offset is off.
type offsetRun struct {
	start, end time.Time
	off        int
}

// offsetRuns appends to out the runs of constant UTC offset that make up
// [lo, hi) (the first starts at lo and the last ends at hi whatever their
// real extent).
func offsetRuns(out []offsetRun, loc *time.Location, lo, hi time.Time) []offsetRun {
	for at := lo; at.Before(hi) && len(out) < maxZoneWalk; {
		off := offsetAt(at, loc)
		end := runEnd(loc, at, off, hi)
		out = append(out, offsetRun{at, end, off})
		at = end
	}
	return out
}

// runEnd returns the first instant in (at, hi] at which loc's offset is no
// longer off, or hi. Time.ZoneBounds gives the candidates; each is checked
// against the offsets themselves, because ZoneBounds is not exact past a
// zone's last explicit transition (Go 1.26 ends the last zone of a leap
// year a day early, and zone bounds there may be a year's start or end
// with no change at all).
func runEnd(loc *time.Location, at time.Time, off int, hi time.Time) time.Time {
	for range maxZoneWalk {
		_, e := at.In(loc).ZoneBounds()
		switch {
		case e.IsZero() || !e.Before(hi):
			if offsetAt(hi, loc) == off {
				return hi
			}
			return firstChange(loc, at, hi, off)
		case !e.After(at):
			// ZoneBounds ended the zone before at (the leap-year slip):
			// that zone runs to the end of the UTC year, at most a day on.
			e = earlier(at.UTC().Truncate(24*time.Hour).Add(24*time.Hour), hi)
			if offsetAt(e, loc) != off {
				return firstChange(loc, at, e, off)
			}
			at = e
			continue
		}
		if offsetAt(e.Add(-time.Nanosecond), loc) != off {
			return firstChange(loc, at, e, off) // the zone ended earlier than said
		}
		if offsetAt(e, loc) != off {
			return e
		}
		at = e // a new zone with the same offset (a name, a DST flag or a year)
	}
	return hi
}

// firstChange bisects (at, x] for the instant loc's offset stops being off,
// given that it is off at at and not at x.
func firstChange(loc *time.Location, at, x time.Time, off int) time.Time {
	for x.Sub(at) > time.Nanosecond {
		mid := at.Add(x.Sub(at) / 2)
		if offsetAt(mid, loc) == off {
			at = mid
		} else {
			x = mid
		}
	}
	return x
}

// clockBounds returns the unit (an hour) containing t: from the latest
// instant at or before t at which the local clock shows a whole unit, or
// the offset changed, to the next such instant.
func clockBounds(t time.Time, loc *time.Location, unit time.Duration) (start, end time.Time) {
	var buf [4]offsetRun
	for _, r := range offsetRuns(buf[:0], loc, t.Add(-unit), t.Add(unit+time.Nanosecond)) {
		if t.Before(r.start) || !t.Before(r.end) {
			continue
		}
		offset := time.Duration(r.off) * time.Second
		start = t.UTC().Add(offset).Truncate(unit).Add(-offset)
		return later(start, r.start).In(loc), earlier(start.Add(unit), r.end).In(loc)
	}
	panic("policy: no offset run contains the instant") // offsetRuns covers the window
}

// calendarBounds returns the local day or month containing t. Its label
// is the latest date the local clock has shown up to t (a clock set back
// across midnight does not reopen the previous day); it starts at the
// first instant the clock showed that date and ends at the first instant
// it shows the next period's first date.
func calendarBounds(period schemas.Period, t time.Time, loc *time.Location) (start, end time.Time) {
	if period == schemas.PeriodDay {
		return datedBounds(t, loc, 24*time.Hour, func(y int, m time.Month, d int) (from, next time.Time) {
			return time.Date(y, m, d, 0, 0, 0, 0, time.UTC), time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
		})
	}
	return datedBounds(t, loc, 31*24*time.Hour, func(y int, m time.Month, _ int) (from, next time.Time) {
		return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC), time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	})
}

// WeekBounds returns the local calendar week containing t that begins on
// first (time.Monday for ISO 8601 weeks), by the rules of PeriodBounds'
// days: from the first instant the clock shows its first date to the
// first instant it shows the next week's.
func WeekBounds(t time.Time, loc *time.Location, first time.Weekday) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	return datedBounds(t, loc, 7*24*time.Hour, func(y int, m time.Month, d int) (from, next time.Time) {
		day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		from = day.AddDate(0, 0, -((int(day.Weekday()) - int(first) + 7) % 7))
		return from, from.AddDate(0, 0, 7)
	})
}

// AnchoredMonthBounds returns the local billing month containing t that
// begins on day anchor (1..31) of each month, by the rules of
// PeriodBounds' months: from the 15th to the next 15th, say. In a month
// too short for the anchor it begins on the month's last day.
func AnchoredMonthBounds(t time.Time, loc *time.Location, anchor int) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	on := func(y int, m time.Month) time.Time {
		last := time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
		return time.Date(y, m, min(anchor, last), 0, 0, 0, 0, time.UTC)
	}
	return datedBounds(t, loc, 32*24*time.Hour, func(y int, m time.Month, d int) (from, next time.Time) {
		if from = on(y, m); time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Before(from) {
			from = on(y, m-1)
		}
		return from, on(from.Year(), from.Month()+1)
	})
}

// datedBounds returns the local period containing t whose first and next
// period's first dates dates computes (as UTC midnights) from the latest
// date the local clock has shown up to t; span is at least the period's
// length. It starts at the first instant the clock showed its first date
// and ends at the first instant it shows the next period's.
func datedBounds(t time.Time, loc *time.Location, span time.Duration, dates func(y int, m time.Month, d int) (from, next time.Time)) (start, end time.Time) {
	// One window holds every offset that matters: the last 2×maxOffset
	// before t (a zone that ended then may have shown a later clock than
	// t's zone shows now), the period's start and its end, each within
	// maxOffset of its clock reading.
	span += maxOffset
	var buf [8]offsetRun
	runs := offsetRuns(buf[:0], loc, t.Add(-span-maxOffset), t.Add(span))
	latest := wallOf(t, loc)
	for _, r := range runs {
		if r.start.After(t) {
			break
		}
		last := earlier(r.end.Add(-time.Nanosecond), t)
		latest = later(latest, last.UTC().Add(time.Duration(r.off)*time.Second))
	}
	from, next := dates(latest.Date())
	return firstShowing(runs, from, t).In(loc), firstShowing(runs, next, t).In(loc)
}

// firstShowing returns the first instant of runs at which the clock shows
// wall or later; def if none does (calendarBounds' window always holds it).
func firstShowing(runs []offsetRun, wall, def time.Time) time.Time {
	for _, r := range runs {
		if at := later(r.start, wall.Add(-time.Duration(r.off)*time.Second)); at.Before(r.end) {
			return at
		}
	}
	return def
}

// DefaultTenant is the policy of a tenant when no policy file is loaded:
// the built-in defaults (hard mode, UTC, DefaultAlertTiers, fail open).
func DefaultTenant(id string) *Tenant {
	t := builtin
	t.ID = id
	return &t
}
