// Package quotastatus is Sluice's one read model of "where does a tenant
// stand": each quota and limit of the tenant with what the current period
// has used, what remains, its alert tier, when the period resets, the
// current rate and the predicted exhaustion, plus the enforcement flags
// gateways see for it and how many of its calls were refused lately.
//
// Readers with different audiences use it: the operators' web console
// (services/console), `sluicectl predictions` (cmd/sluicectl) and the
// tenants' usage API, GET /v1/usage, on `sluice gateway` and on ingest
// (internal/usageapi). All call Service.Tenant or Overview, so
// what a tenant's developers read from the API is what an operator sees on
// the tenant's page and in the terminal, by construction.
//
// The Service merges three sources behind two ports, so that tests and
// other deployments can give their own:
//
//   - StateStore: the aggregator's quota_state rows of the open periods
//     (used, limit — overrides included —, tier, rate, predicted
//     exhaustion) and the refused calls; chstate is the ClickHouse adapter.
//     Predictions are read as the aggregator stores them, so a better
//     forecast shows up here without a change.
//   - FlagStore: the flags the enforcer writes for gateways; redisflags
//     reads them from Redis in the sdk/go/flags layout.
//   - the quota policy, for the quotas a tenant has not used yet in this
//     period (no quota_state row exists before the first event): they are
//     listed with nothing used, so a new tenant still sees its limits.
package quotastatus

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Quota is one quota of a tenant × model key in its current period. Its
// JSON form is the usage API's (docs/usage-api.md): field names are a
// contract.
type Quota struct {
	// Model is the model the quota covers, or "*" for all models together.
	Model string `json:"model"`
	// Quota names the quota (monthly_tokens, hourly_tokens, budget, ...).
	Quota schemas.QuotaKind `json:"quota"`
	// Period is the length of its counting period; Unit what it counts.
	Period schemas.Period `json:"period"`
	Unit   schemas.Unit   `json:"unit"`
	// Count is "billed" for a token quota that counts billed-equivalent
	// tokens (the policy's count: billed): Limit, Used and the rate are
	// then in those. Empty for total tokens and the other units.
	Count string `json:"count,omitempty"`
	// Mode is hard (calls are refused at the limit) or soft (overage is
	// recorded for billing).
	Mode schemas.Mode `json:"mode"`
	// Limit is the limit in force, a temporary override included; Used is
	// what the period has consumed; Remaining is what is left (never
	// negative).
	Limit     float64 `json:"limit"`
	Used      float64 `json:"used"`
	Remaining float64 `json:"remaining"`
	// UsedPercent is Used over Limit in percent (100 for a limit of 0,
	// which an operator sets to stop spend).
	UsedPercent float64 `json:"used_percent"`
	// Tier is the highest alert tier reached (0, 70, 90, 100, ...).
	Tier int `json:"tier"`
	// PeriodStart and ResetsAt bound the period, [start, end); the quota
	// starts from zero again at ResetsAt.
	PeriodStart time.Time `json:"period_start"`
	ResetsAt    time.Time `json:"resets_at"`
	// RatePerMinute is the recent consumption rate in Unit per minute.
	RatePerMinute float64 `json:"rate_per_minute"`
	// PredictedExhaustion is when the quota runs out at the current rate;
	// nil when the aggregator predicts none (no use, or not before the
	// period ends).
	PredictedExhaustion *time.Time `json:"predicted_exhaustion"`
	// PredictedEarliest and PredictedLatest bound the prediction (its
	// uncertainty); nil without a prediction, and a nil latest beside one
	// means the quota may well last its period. PredictionBasis says what
	// the prediction rests on: "rates" (the one- and five-minute rates of
	// the first minutes of traffic) or "forecast" (the trend over
	// completed minutes); empty without one.
	PredictedEarliest *time.Time `json:"predicted_earliest"`
	PredictedLatest   *time.Time `json:"predicted_latest"`
	PredictionBasis   string     `json:"prediction_basis,omitempty"`
	// UpdatedAt is when the aggregator last wrote the figures; nil when
	// the period has no use yet (the quota comes from the policy alone).
	UpdatedAt *time.Time `json:"updated_at"`
}

// Prediction says when the quota runs out, relative to now, with its
// range and basis: "in 1m5s (50s-1m40s) rates", "in 3h55m (3h39m-) forecast"
// (an open end: it may well last its period), "now" once the time has
// come, "-" without a prediction. Times an hour or more ahead are rounded
// to the minute. The console and sluicectl show it.
func (q Quota) Prediction(now time.Time) string {
	if q.PredictedExhaustion == nil {
		return "-"
	}
	if !q.PredictedExhaustion.After(now) {
		return "now"
	}
	left := func(t time.Time) string {
		d := t.Sub(now)
		switch {
		case d <= 0:
			return "0s"
		case d >= time.Hour:
			return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
		}
		return d.Round(time.Second).String()
	}
	s := "in " + left(*q.PredictedExhaustion)
	if q.PredictedEarliest != nil {
		s += " (" + left(*q.PredictedEarliest) + "-"
		if q.PredictedLatest != nil {
			s += left(*q.PredictedLatest)
		}
		s += ")"
	}
	if q.PredictionBasis != "" {
		s += " " + q.PredictionBasis
	}
	return s
}

// Flag is one enforcement flag of a tenant, as gateways see it.
type Flag struct {
	// Model is the model the flag stops, "*" for every model; empty when
	// the flag is on one API key (APIKeyID).
	Model    string `json:"model,omitempty"`
	APIKeyID string `json:"api_key_id,omitempty"`
	// State is open, half_open, throttle, blacklist or soft; Kind the breaker
	// that raised it (quota, rate, error_ratio, slow_call, manual,
	// blacklist); Quota the quota hit, for quota and rate flags.
	State flags.State `json:"state"`
	Kind  flags.Kind  `json:"kind"`
	Quota string      `json:"quota,omitempty"`
	// Until is when the flag stops applying by itself; nil when it lasts
	// until a change (for a quota, its period's end: see ResetsAt).
	Until *time.Time `json:"until"`
	// ResetsAt is when the quota's period ends, for quota flags.
	ResetsAt *time.Time `json:"resets_at,omitempty"`
	// RetryAfterSeconds is what gateways answer in Retry-After.
	RetryAfterSeconds float64 `json:"retry_after_seconds,omitempty"`
	// Reason is the operator's note. It is never sent to tenants (see
	// docs/flags.md), hence no JSON: the console shows it, the usage API
	// does not.
	Reason string `json:"-"`
}

// Refusing reports whether the flag refuses calls outright (half-open lets
// a few probes through, throttle lifts as the rate window moves).
func (f Flag) Refusing() bool { return f.State == flags.StateOpen || f.State == flags.StateBlacklist }

// Status is a tenant's standing: the JSON body of GET /v1/usage.
type Status struct {
	Tenant string `json:"tenant"`
	// Plan is the policy plan the tenant takes, empty for none.
	Plan string `json:"plan,omitempty"`
	// AsOf is when the status was read.
	AsOf time.Time `json:"as_of"`
	// Quotas are ordered by model ("*" first), then period (minute to
	// month), then name; never null.
	Quotas []Quota `json:"quotas"`
	// Flags are the active enforcement flags; never null.
	Flags []Flag `json:"flags"`
	// RefusedLastHour counts the tenant's calls refused in the last hour
	// (by flags or admission), from the usage events gateways report.
	RefusedLastHour int64 `json:"refused_last_hour"`
}

// Worst returns the quota with the highest UsedPercent, or nil when the
// tenant has none.
func (s Status) Worst() *Quota {
	var w *Quota
	for i := range s.Quotas {
		if w == nil || s.Quotas[i].UsedPercent > w.UsedPercent {
			w = &s.Quotas[i]
		}
	}
	return w
}

// Tier returns the highest tier of any quota.
func (s Status) Tier() int {
	t := 0
	for _, q := range s.Quotas {
		t = max(t, q.Tier)
	}
	return t
}

// NextExhaustion returns the earliest predicted exhaustion of any quota,
// nil when none is predicted.
func (s Status) NextExhaustion() *time.Time {
	var n *time.Time
	for _, q := range s.Quotas {
		if q.PredictedExhaustion != nil && (n == nil || q.PredictedExhaustion.Before(*n)) {
			n = q.PredictedExhaustion
		}
	}
	return n
}

// Refusing reports whether any flag refuses calls outright.
func (s Status) Refusing() bool {
	for _, f := range s.Flags {
		if f.Refusing() {
			return true
		}
	}
	return false
}

// TenantQuota is a Quota with its tenant, as StateStore lists them.
type TenantQuota struct {
	Tenant string
	Quota
}

// StateStore is where quota figures come from (chstate: ClickHouse).
type StateStore interface {
	// Quotas returns the quotas of the periods open at now, of tenant, or
	// of every tenant when tenant is "". Remaining and UsedPercent need
	// not be set.
	Quotas(ctx context.Context, tenant string, now time.Time) ([]TenantQuota, error)
	// Refused counts calls refused since since, by tenant (tenant "" for
	// every tenant).
	Refused(ctx context.Context, tenant string, since time.Time) (map[string]int64, error)
}

// FlagStore is where enforcement flags come from (redisflags: Redis).
type FlagStore interface {
	// Flags returns the flags of tenant active at now.
	Flags(ctx context.Context, tenant string, now time.Time) ([]Flag, error)
	// AllFlags returns the active flags of every tenant that has any.
	AllFlags(ctx context.Context, now time.Time) (map[string][]Flag, error)
}

// Service answers "where does a tenant stand" from a StateStore, a
// FlagStore and the policy. It is safe for concurrent use.
type Service struct {
	state  StateStore
	flags  FlagStore
	policy func() *policy.Policy
	now    func() time.Time
}

// New returns a Service. flagStore may be nil (no flags are listed);
// currentPolicy may be nil or return nil (only quotas with use are listed).
func New(state StateStore, flagStore FlagStore, currentPolicy func() *policy.Policy) *Service {
	return &Service{state: state, flags: flagStore, policy: currentPolicy, now: time.Now}
}

// WithClock replaces the clock (tests).
func (s *Service) WithClock(now func() time.Time) *Service {
	s.now = now
	return s
}

// refusalWindow is how far back RefusedLastHour counts.
const refusalWindow = time.Hour

// Tenant returns one tenant's status. A tenant nothing is known about gets
// its policy's quotas (the defaults') with nothing used.
func (s *Service) Tenant(ctx context.Context, tenant string) (Status, error) {
	if why := schemas.CheckTenant(tenant); why != "" {
		return Status{}, fmt.Errorf("%w: tenant %q: %s", ErrBadTenant, tenant, why)
	}
	now := s.now().UTC().Truncate(time.Second)
	rows, err := s.state.Quotas(ctx, tenant, now)
	if err != nil {
		return Status{}, err
	}
	refused, err := s.state.Refused(ctx, tenant, now.Add(-refusalWindow))
	if err != nil {
		return Status{}, err
	}
	var fl []Flag
	if s.flags != nil {
		if fl, err = s.flags.Flags(ctx, tenant, now); err != nil {
			return Status{}, err
		}
	}
	return build(tenant, rowsOf(rows), fl, refused[tenant], s.currentPolicy(), now), nil
}

// Overview returns the status of every tenant known to the policy, the
// quota state of the open periods or the flags, sorted by tenant.
func (s *Service) Overview(ctx context.Context) ([]Status, error) {
	now := s.now().UTC().Truncate(time.Second)
	rows, err := s.state.Quotas(ctx, "", now)
	if err != nil {
		return nil, err
	}
	refused, err := s.state.Refused(ctx, "", now.Add(-refusalWindow))
	if err != nil {
		return nil, err
	}
	allFlags := map[string][]Flag{}
	if s.flags != nil {
		if allFlags, err = s.flags.AllFlags(ctx, now); err != nil {
			return nil, err
		}
	}
	byTenant := map[string][]Quota{}
	for _, r := range rows {
		byTenant[r.Tenant] = append(byTenant[r.Tenant], r.Quota)
	}
	p := s.currentPolicy()
	names := map[string]bool{}
	for t := range byTenant {
		names[t] = true
	}
	for t := range allFlags {
		names[t] = true
	}
	if p != nil {
		for _, t := range p.TenantIDs() {
			names[t] = true
		}
	}
	out := make([]Status, 0, len(names))
	for t := range names {
		out = append(out, build(t, byTenant[t], allFlags[t], refused[t], p, now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out, nil
}

func (s *Service) currentPolicy() *policy.Policy {
	if s.policy == nil {
		return nil
	}
	return s.policy()
}

func rowsOf(rows []TenantQuota) []Quota {
	out := make([]Quota, len(rows))
	for i, r := range rows {
		out[i] = r.Quota
	}
	return out
}

// build merges a tenant's stored quotas with its policy's, and derives
// what the stores leave out.
func build(tenant string, rows []Quota, fl []Flag, refused int64, p *policy.Policy, now time.Time) Status {
	st := Status{Tenant: tenant, AsOf: now, Quotas: []Quota{}, Flags: []Flag{}, RefusedLastHour: refused}
	type key struct {
		model string
		quota schemas.QuotaKind
	}
	have := map[key]bool{}
	for _, q := range rows {
		have[key{q.Model, q.Quota}] = true
		st.Quotas = append(st.Quotas, q)
	}
	if p != nil {
		t := p.Tenant(tenant)
		st.Plan = t.Plan
		billed := map[key]bool{}
		for model := range t.Models {
			for _, pq := range t.Quotas(model) {
				billed[key{model, pq.Name}] = pq.Billed
				if have[key{model, pq.Name}] {
					continue
				}
				start, end := t.PeriodBounds(pq.Period, now)
				st.Quotas = append(st.Quotas, Quota{Model: model, Quota: pq.Name, Period: pq.Period, Unit: pq.Unit,
					Mode: pq.Mode, Limit: pq.Limit, PeriodStart: start.UTC(), ResetsAt: end.UTC()})
			}
		}
		for i := range st.Quotas {
			if q := &st.Quotas[i]; billed[key{q.Model, q.Quota}] {
				q.Count = string(policy.CountBilled)
			}
		}
	}
	for i := range st.Quotas {
		derive(&st.Quotas[i])
	}
	sort.Slice(st.Quotas, func(i, j int) bool {
		a, b := st.Quotas[i], st.Quotas[j]
		if (a.Model == policy.AllModels) != (b.Model == policy.AllModels) {
			return a.Model == policy.AllModels
		}
		if a.Model != b.Model {
			return a.Model < b.Model
		}
		if pa, pb := periodRank(a.Period), periodRank(b.Period); pa != pb {
			return pa < pb
		}
		return a.Quota < b.Quota
	})
	if fl != nil {
		st.Flags = fl
	}
	sort.Slice(st.Flags, func(i, j int) bool {
		a, b := st.Flags[i], st.Flags[j]
		if a.Model != b.Model {
			return a.Model < b.Model
		}
		if a.APIKeyID != b.APIKeyID {
			return a.APIKeyID < b.APIKeyID
		}
		return a.Kind < b.Kind
	})
	return st
}

// derive fills Remaining and UsedPercent.
func derive(q *Quota) {
	q.Remaining = max(0, q.Limit-q.Used)
	if q.Limit <= 0 {
		q.UsedPercent = 100
		return
	}
	q.UsedPercent = 100 * q.Used / q.Limit
}

func periodRank(p schemas.Period) int {
	switch p {
	case schemas.PeriodMinute:
		return 0
	case schemas.PeriodHour:
		return 1
	case schemas.PeriodDay:
		return 2
	case schemas.PeriodMonth:
		return 3
	}
	return 4
}

// ErrBadTenant is returned for a tenant name no tenant can have; every
// other error of Tenant is a store failing.
var ErrBadTenant = errors.New("quotastatus: not a tenant name")
