package schemas

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// Signal is signal v1: a change in a tenant's quota state that the
// aggregator computed from usage events and produces to [TopicSignalsV1].
// The enforcer turns signals into flags and the alerter into notifications.
//
// Signals are emitted on change only, and computed from event time and
// Kafka offsets alone, never from the wall clock, so that replaying the same
// offsets yields the same signals with the same IDs, which consumers
// deduplicate. Build the ID with [SignalID].
//
// Required: ID, Kind, Time, Tenant and Model. Which other fields are
// meaningful depends on Kind; absent numbers are zero. [Signal.Validate]
// lists the rules.
type Signal struct {
	// ID identifies the signal deterministically; see SignalID. Same rules as
	// UsageEvent.ID.
	ID string `json:"id"`

	// Kind says what changed.
	Kind SignalKind `json:"kind"`

	// Time is the event time the signal was computed at: the time of the
	// latest usage event that contributed, not the aggregator's clock.
	Time time.Time `json:"time"`

	// Tenant is the tenant the signal is about. Same rules as
	// UsageEvent.Tenant.
	Tenant string `json:"tenant"`

	// Model is the model the quota covers, or "*" for a quota over all
	// models. Same rules as UsageEvent.Model.
	Model string `json:"model"`

	// Quota names which quota of the tenant's policy the signal is about;
	// empty for kinds not tied to one (anomaly, late_event).
	Quota QuotaKind `json:"quota,omitempty"`

	// Period is the length of the quota's counting period.
	Period Period `json:"period,omitempty"`

	// PeriodStart and PeriodEnd bound the counting period the numbers belong
	// to, [start, end), in the tenant's time zone, so that consumers need not
	// know the policy to tell which month a signal is about.
	PeriodStart time.Time `json:"period_start,omitzero"`
	// PeriodEnd is the exclusive end of the period; see PeriodStart.
	PeriodEnd time.Time `json:"period_end,omitzero"`

	// Tier is the alert tier after the change, in percent of Limit, for
	// example 0, 70, 90 or 100: 0 to MaxTier.
	Tier int `json:"tier,omitempty"`

	// PreviousTier is the tier before the change, so that a consumer that
	// missed a signal can still tell what happened.
	PreviousTier int `json:"previous_tier,omitempty"`

	// Direction says whether a tier_crossed signal went up or down; tiers
	// come down with hysteresis, after a period reset or a raised limit.
	Direction Direction `json:"direction,omitempty"`

	// Used is how much of the quota the period has consumed, in Unit.
	Used float64 `json:"used,omitempty"`

	// Limit is the quota's limit for the period, in Unit; 0 when the kind has
	// none.
	Limit float64 `json:"limit,omitempty"`

	// Unit is what Used and Limit count.
	Unit Unit `json:"unit,omitempty"`

	// Rate is the recent consumption rate in Unit per minute, which
	// exhaustion predictions extrapolate.
	Rate float64 `json:"rate,omitempty"`

	// PredictedExhaustion is when the quota runs out at the current Rate;
	// nil when no prediction was made. Required for exhaustion_predicted.
	PredictedExhaustion *time.Time `json:"predicted_exhaustion,omitempty"`

	// Mode is the quota's enforcement mode: hard quotas block at their limit,
	// soft ones only record overage.
	Mode Mode `json:"mode,omitempty"`

	// Reason explains the signal to a human, for alerts and audit logs. At
	// most MaxReasonLen bytes.
	Reason string `json:"reason,omitempty"`

	// Source is the range of usage-topic offsets the signal was computed
	// from, for audits and for replays.
	Source SignalSource `json:"source,omitzero"`

	// Attributes carries extra detail, for example the anomaly detector's
	// figures. Same limits as UsageEvent.Attributes.
	Attributes map[string]string `json:"attributes,omitempty"`
}

// SignalSource is the Kafka partition and offset range of TopicUsageV1 that
// a Signal was computed from.
type SignalSource struct {
	// Partition is the usage topic's partition.
	Partition int32 `json:"partition"`
	// FromOffset is the first offset that contributed.
	FromOffset int64 `json:"from_offset"`
	// ToOffset is the last offset that contributed, at least FromOffset.
	ToOffset int64 `json:"to_offset"`
}

// SignalID returns a deterministic signal ID made of parts: 32 lower-case
// hex digits of a 128-bit hash. Producers build it from what identifies the
// change, for example
//
//	SignalID(string(kind), tenant, model, string(quota), periodStart.Format(time.RFC3339), strconv.Itoa(tier))
//
// so that recomputing the signal after a crash or a replay gives the same ID
// and consumers drop the duplicate. Each part is length-prefixed before
// hashing, so ("ab", "c") and ("a", "bc") give different IDs.
func SignalID(parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// Attributes of exhaustion_predicted signals. The aggregator carries a
// prediction's uncertainty in them, and a prediction that no longer holds
// as AttrState = StateClear (PredictedExhaustion is then the new, later
// prediction, or the period's end when there is none).
const (
	// AttrPredictedEarliest and AttrPredictedLatest bound
	// PredictedExhaustion (RFC 3339): the earliest and latest plausible
	// exhaustion. Latest is absent when the quota may well last the period.
	AttrPredictedEarliest = "predicted_earliest"
	AttrPredictedLatest   = "predicted_latest"
	// AttrPredictionBasis says what the prediction rests on: "rates" (the
	// one- and five-minute rates of the first minutes of traffic) or
	// "forecast" (the trend over completed minutes).
	AttrPredictionBasis = "prediction_basis"
	// AttrState is a condition's state; anomaly signals use "firing" and
	// "resolved", exhaustion_predicted StateClear.
	AttrState = "state"
	// StateClear: the condition a signal announced earlier no longer holds.
	StateClear = "clear"
)

// SignalKind says what changed in a tenant's quota state.
type SignalKind string

// The kinds of signal v1.
const (
	// SignalTierCrossed: usage crossed an alert tier (70, 90, 100 … percent)
	// up, or back down with hysteresis. Direction, Tier and PreviousTier say
	// which.
	SignalTierCrossed SignalKind = "tier_crossed"
	// SignalExhaustionPredicted: at the current rate the quota runs out
	// before the alert horizon; PredictedExhaustion says when.
	SignalExhaustionPredicted SignalKind = "exhaustion_predicted"
	// SignalQuotaExhausted: usage reached the limit. A hard quota's breaker
	// opens on it.
	SignalQuotaExhausted SignalKind = "quota_exhausted"
	// SignalPeriodReset: a new counting period began and usage restarts from
	// zero; quota breakers close on it.
	SignalPeriodReset SignalKind = "period_reset"
	// SignalRateExceeded: a tokens- or requests-per-minute window went over
	// its limit.
	SignalRateExceeded SignalKind = "rate_exceeded"
	// SignalAnomaly: a rate spike, error ratio or slow-call ratio out of the
	// ordinary; Reason and Attributes say which.
	SignalAnomaly SignalKind = "anomaly"
	// SignalLateEvent: an event arrived for a period already closed; it was
	// counted, and reports for that period change.
	SignalLateEvent SignalKind = "late_event"
	// SignalReconciliationDrift: the nightly reconciler found the counters
	// and the raw events disagreeing.
	SignalReconciliationDrift SignalKind = "reconciliation_drift"
)

// Valid reports whether k is a kind this version of the package knows.
func (k SignalKind) Valid() bool {
	switch k {
	case SignalTierCrossed, SignalExhaustionPredicted, SignalQuotaExhausted, SignalPeriodReset,
		SignalRateExceeded, SignalAnomaly, SignalLateEvent, SignalReconciliationDrift:
		return true
	}
	return false
}

// QuotaKind names one quota of a tenant's policy.
type QuotaKind string

// The quotas a policy can set.
const (
	// QuotaMonthlyTokens limits tokens per calendar month.
	QuotaMonthlyTokens QuotaKind = "monthly_tokens"
	// QuotaDailyTokens limits tokens per day.
	QuotaDailyTokens QuotaKind = "daily_tokens"
	// QuotaHourlyTokens limits tokens per hour.
	QuotaHourlyTokens QuotaKind = "hourly_tokens"
	// QuotaTokensPerMinute limits tokens in a sliding one-minute window (TPM).
	QuotaTokensPerMinute QuotaKind = "tokens_per_minute"
	// QuotaRequestsPerMinute limits requests in a sliding one-minute window
	// (RPM).
	QuotaRequestsPerMinute QuotaKind = "requests_per_minute"
	// QuotaBudget limits spend, in the currency of the tenant's price table,
	// per period.
	QuotaBudget QuotaKind = "budget"
)

// quotaSpecs is the one table of quota kinds: each kind's counting period
// and unit. Policy parsing, the aggregator, the enforcer's admin API and the
// reconciler all read it through the methods below.
var quotaSpecs = map[QuotaKind]struct {
	period Period
	unit   Unit
}{
	QuotaMonthlyTokens:     {PeriodMonth, UnitTokens},
	QuotaDailyTokens:       {PeriodDay, UnitTokens},
	QuotaHourlyTokens:      {PeriodHour, UnitTokens},
	QuotaTokensPerMinute:   {PeriodMinute, UnitTokens},
	QuotaRequestsPerMinute: {PeriodMinute, UnitRequests},
	QuotaBudget:            {PeriodMonth, UnitCurrency},
}

// QuotaKinds lists every quota kind, longest period first.
func QuotaKinds() []QuotaKind {
	return []QuotaKind{QuotaMonthlyTokens, QuotaDailyTokens, QuotaHourlyTokens,
		QuotaTokensPerMinute, QuotaRequestsPerMinute, QuotaBudget}
}

// Valid reports whether q is a defined quota.
func (q QuotaKind) Valid() bool {
	_, ok := quotaSpecs[q]
	return ok
}

// Period is the period q is counted over; empty for an undefined kind.
func (q QuotaKind) Period() Period { return quotaSpecs[q].period }

// Unit is what q counts; empty for an undefined kind.
func (q QuotaKind) Unit() Unit { return quotaSpecs[q].unit }

// Period is the length of a quota's counting period.
type Period string

// The counting periods.
const (
	// PeriodMinute is a one-minute window, used by rate quotas.
	PeriodMinute Period = "minute"
	// PeriodHour is an hour of the tenant's time zone.
	PeriodHour Period = "hour"
	// PeriodDay is a calendar day of the tenant's time zone.
	PeriodDay Period = "day"
	// PeriodMonth is a calendar month of the tenant's time zone.
	PeriodMonth Period = "month"
)

// Valid reports whether p is a defined period.
func (p Period) Valid() bool {
	switch p {
	case PeriodMinute, PeriodHour, PeriodDay, PeriodMonth:
		return true
	}
	return false
}

// Direction is which way a tier was crossed.
type Direction string

// The directions of a tier crossing.
const (
	// DirectionUp is usage rising past a tier.
	DirectionUp Direction = "up"
	// DirectionDown is usage falling back below a tier, after a period reset
	// or a raised limit.
	DirectionDown Direction = "down"
)

// Valid reports whether d is a defined direction.
func (d Direction) Valid() bool { return d == DirectionUp || d == DirectionDown }

// Unit is what a signal's Used and Limit count.
type Unit string

// The units of signal amounts.
const (
	// UnitTokens counts tokens, prompt plus completion.
	UnitTokens Unit = "tokens"
	// UnitRequests counts requests.
	UnitRequests Unit = "requests"
	// UnitCurrency is money in the currency of the tenant's price table.
	UnitCurrency Unit = "currency"
)

// Valid reports whether u is a defined unit.
func (u Unit) Valid() bool { return u == UnitTokens || u == UnitRequests || u == UnitCurrency }

// Mode is a quota's enforcement mode.
type Mode string

// The enforcement modes.
const (
	// ModeHard blocks requests once the quota is exhausted.
	ModeHard Mode = "hard"
	// ModeSoft lets requests through and records the overage for billing.
	ModeSoft Mode = "soft"
)

// Valid reports whether m is a defined mode.
func (m Mode) Valid() bool { return m == ModeHard || m == ModeSoft }
