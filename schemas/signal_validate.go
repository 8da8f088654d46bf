package schemas

import (
	"fmt"
	"math"
	"unicode/utf8"
)

// Validate checks every rule of signal v1 and reports every broken one at
// once as a [ValidationError]; it returns nil for a valid signal.
//
// The rules:
//
//   - id, tenant, model: as in [UsageEvent.Validate]; model "*" means all
//     models.
//   - kind: one of the SignalKind constants. A consumer that meets a kind it
//     does not know (a newer producer) should log and skip the signal.
//   - time: set, between 1970 and 2105 (MaxEventTimeText).
//   - quota, period, direction, unit, mode: empty or one of their constants.
//   - period_start, period_end: both or neither, and end after start.
//   - tier, previous_tier: 0 to MaxTier.
//   - tier_crossed: direction set and consistent with tier and previous_tier.
//   - exhaustion_predicted: predicted_exhaustion set.
//   - used, limit, rate: finite and not negative.
//   - reason: valid UTF-8, at most MaxReasonLen bytes.
//   - source: partition and from_offset not negative, to_offset at least
//     from_offset.
//   - attributes: as in [UsageEvent.Validate].
func (s *Signal) Validate() error {
	var errs ValidationError
	s.validate(&errs, 0)
	return errs.Err()
}

// signalField bits name the fields a decoder already reported, so that
// validation does not report them twice.
type signalField uint32

const (
	sfID signalField = 1 << iota
	sfKind
	sfTime
	sfTenant
	sfModel
	sfQuota
	sfPeriod
	sfPeriodStart
	sfPeriodEnd
	sfTier
	sfPreviousTier
	sfDirection
	sfUsed
	sfLimit
	sfUnit
	sfRate
	sfPredictedExhaustion
	sfMode
	sfReason
	sfSource
	sfAttributes
)

// signalFieldNamed returns the bit of a JSON field name, or 0 if signal v1
// has no such field. A switch, which the compiler turns into a search by
// length and bytes: a loop over the names cost a fifth of DecodeSignal.
func signalFieldNamed(name string) signalField {
	switch name {
	case "id":
		return sfID
	case "kind":
		return sfKind
	case "time":
		return sfTime
	case "tenant":
		return sfTenant
	case "model":
		return sfModel
	case "quota":
		return sfQuota
	case "period":
		return sfPeriod
	case "period_start":
		return sfPeriodStart
	case "period_end":
		return sfPeriodEnd
	case "tier":
		return sfTier
	case "previous_tier":
		return sfPreviousTier
	case "direction":
		return sfDirection
	case "used":
		return sfUsed
	case "limit":
		return sfLimit
	case "unit":
		return sfUnit
	case "rate":
		return sfRate
	case "predicted_exhaustion":
		return sfPredictedExhaustion
	case "mode":
		return sfMode
	case "reason":
		return sfReason
	case "source":
		return sfSource
	case "attributes":
		return sfAttributes
	}
	return 0
}

// validate appends the problems of s to errs, leaving out the fields in
// skip, which the decoder has already reported.
func (s *Signal) validate(errs *ValidationError, skip signalField) {
	check := func(f signalField, field, reason string) {
		if reason != "" && skip&f == 0 {
			errs.Add("", field, reason)
		}
	}
	check(sfID, "id", CheckID(s.ID))
	switch {
	case s.Kind == "":
		check(sfKind, "kind", "is required; use one of tier_crossed, exhaustion_predicted, quota_exhausted, period_reset, rate_exceeded, anomaly, late_event, reconciliation_drift")
	case !s.Kind.Valid():
		check(sfKind, "kind", fmt.Sprintf("is %q, a kind signal v1 does not define; a consumer should skip signals of kinds it does not know", string(s.Kind)))
	}
	check(sfTime, "time", CheckEventTime(s.Time))
	check(sfTenant, "tenant", checkTenant(s.Tenant))
	check(sfModel, "model", checkModel(s.Model))
	if s.Quota != "" && !s.Quota.Valid() {
		check(sfQuota, "quota", fmt.Sprintf("is %q; use one of monthly_tokens, daily_tokens, hourly_tokens, tokens_per_minute, requests_per_minute, budget", string(s.Quota)))
	}
	if s.Period != "" && !s.Period.Valid() {
		check(sfPeriod, "period", fmt.Sprintf("is %q; use one of minute, hour, day, month", string(s.Period)))
	}
	switch {
	case s.PeriodStart.IsZero() != s.PeriodEnd.IsZero():
		if s.PeriodStart.IsZero() {
			check(sfPeriodStart, "period_start", "is required when period_end is set")
		} else {
			check(sfPeriodEnd, "period_end", "is required when period_start is set")
		}
	case !s.PeriodStart.IsZero():
		check(sfPeriodStart, "period_start", CheckEventTime(s.PeriodStart))
		check(sfPeriodEnd, "period_end", CheckEventTime(s.PeriodEnd))
		if !s.PeriodEnd.After(s.PeriodStart) && skip&(sfPeriodStart|sfPeriodEnd) == 0 {
			check(sfPeriodEnd, "period_end", "must be after period_start")
		}
	}
	check(sfTier, "tier", checkTier(s.Tier))
	check(sfPreviousTier, "previous_tier", checkTier(s.PreviousTier))
	switch {
	case s.Direction != "" && !s.Direction.Valid():
		check(sfDirection, "direction", fmt.Sprintf("is %q; use up or down", string(s.Direction)))
	case s.Kind == SignalTierCrossed && s.Direction == "":
		check(sfDirection, "direction", "is required for tier_crossed; use up or down")
	case s.Kind == SignalTierCrossed && skip&(sfTier|sfPreviousTier) == 0:
		if s.Direction == DirectionUp && s.Tier <= s.PreviousTier {
			check(sfDirection, "direction", fmt.Sprintf("is up but tier %d is not above previous_tier %d", s.Tier, s.PreviousTier))
		}
		if s.Direction == DirectionDown && s.Tier >= s.PreviousTier {
			check(sfDirection, "direction", fmt.Sprintf("is down but tier %d is not below previous_tier %d", s.Tier, s.PreviousTier))
		}
	}
	check(sfUsed, "used", checkAmount(s.Used))
	check(sfLimit, "limit", checkAmount(s.Limit))
	check(sfRate, "rate", checkAmount(s.Rate))
	if s.Unit != "" && !s.Unit.Valid() {
		check(sfUnit, "unit", fmt.Sprintf("is %q; use one of tokens, requests, currency", string(s.Unit)))
	}
	switch {
	case s.PredictedExhaustion != nil:
		check(sfPredictedExhaustion, "predicted_exhaustion", CheckEventTime(*s.PredictedExhaustion))
	case s.Kind == SignalExhaustionPredicted:
		check(sfPredictedExhaustion, "predicted_exhaustion", "is required for exhaustion_predicted")
	}
	if s.Mode != "" && !s.Mode.Valid() {
		check(sfMode, "mode", fmt.Sprintf("is %q; use hard or soft", string(s.Mode)))
	}
	switch {
	case len(s.Reason) > MaxReasonLen:
		check(sfReason, "reason", fmt.Sprintf("is %d bytes long; the maximum is %d bytes (MaxReasonLen)", len(s.Reason), MaxReasonLen))
	case !utf8.ValidString(s.Reason):
		check(sfReason, "reason", "is not valid UTF-8")
	}
	if skip&sfSource == 0 {
		src := s.Source
		if src.Partition < 0 {
			errs.Add("", "source.partition", fmt.Sprintf("is %d; partitions are numbered from 0", src.Partition))
		}
		if src.FromOffset < 0 {
			errs.Add("", "source.from_offset", fmt.Sprintf("is %d; offsets are not negative", src.FromOffset))
		}
		if src.ToOffset < src.FromOffset {
			errs.Add("", "source.to_offset", fmt.Sprintf("is %d, before from_offset %d", src.ToOffset, src.FromOffset))
		}
	}
	if skip&sfAttributes == 0 {
		checkAttributes(errs, "", s.Attributes)
	}
}

func checkTier(t int) string {
	if t < 0 || t > MaxTier {
		return fmt.Sprintf("is %d; tiers are percentages from 0 to %d (MaxTier)", t, MaxTier)
	}
	return ""
}

func checkAmount(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "is not a finite number"
	case v < 0:
		return fmt.Sprintf("is %g; amounts cannot be negative", v)
	}
	return ""
}
