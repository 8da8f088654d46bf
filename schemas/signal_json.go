package schemas

import (
	"encoding/json"
	"strconv"
	"time"
)

// EncodeSignal validates s and returns its JSON encoding, the record value
// of [TopicSignalsV1]. An invalid signal is not encoded: a producer that
// emitted it would hand every consumer a poison record.
//
// Signals are few (one per change of a tenant's state), so encoding/json
// does the work; numbers that are zero and optional strings that are empty
// are left out.
func EncodeSignal(s *Signal) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// DecodeSignal decodes one signal v1 into s, which it resets first, and
// validates it. Problems come back together as a [ValidationError]; JSON
// that is not well-formed comes back as a [*SyntaxError].
//
// Unlike [DecodeUsageEvent] it ignores fields it does not know. Signals are
// produced inside Sluice, and the aggregator that adds an optional field to
// signal v1 is deployed before or after the enforcer and the alerter that
// read them; a strict decoder would turn every such additive change into an
// outage of the consumers. Usage events come from outside, where an unknown
// field is a sender's mistake that would otherwise lose data, so they are
// rejected there. Duplicate fields are rejected here too, because which of
// two values wins is not something to leave to a parser.
//
// A signal whose kind this version does not know is decoded completely and
// reported as a problem with "kind", so that the consumer can log and skip
// it.
func DecodeSignal(data []byte, s *Signal) error {
	*s = Signal{}
	d := scanner{s: string(data)}
	d.skipWS()
	if d.pos == len(d.s) {
		return d.syntaxError("empty input; a signal is one JSON object")
	}
	if d.peek() != '{' {
		return d.syntaxError("a signal is a JSON object, but the input starts with " + describe(d.peek()))
	}
	var errs ValidationError
	var seen, bad signalField
	d.pos++
	d.skipWS()
	if d.peek() == '}' {
		d.pos++
	} else {
		for {
			key, err := d.readKey()
			if err != nil {
				return err
			}
			f := lookupSignalField(key)
			switch {
			case f == 0:
				err = d.skipValue(0) // forward compatibility: see above
			case seen&f != 0:
				errs.add("", key, "appears more than once; send each field once")
				bad |= f
				err = d.skipValue(0)
			default:
				seen |= f
				var reason string
				reason, err = d.decodeSignalField(s, f, &errs)
				if reason != "" {
					errs.add("", key, reason)
					bad |= f
				}
			}
			if err != nil {
				return err
			}
			done, err := d.next()
			if err != nil {
				return err
			}
			if done {
				break
			}
		}
	}
	d.skipWS()
	if d.pos != len(d.s) {
		return d.syntaxError("unexpected data after the signal object")
	}
	s.validate(&errs, bad)
	return errs.err()
}

func lookupSignalField(name string) signalField {
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

func (d *scanner) decodeSignalField(s *Signal, f signalField, errs *ValidationError) (reason string, err *SyntaxError) {
	switch f {
	case sfID:
		return d.stringField(&s.ID, true)
	case sfKind:
		return d.stringField((*string)(&s.Kind), true)
	case sfTenant:
		return d.stringField(&s.Tenant, true)
	case sfModel:
		return d.stringField(&s.Model, true)
	case sfQuota:
		return d.stringField((*string)(&s.Quota), false)
	case sfPeriod:
		return d.stringField((*string)(&s.Period), false)
	case sfDirection:
		return d.stringField((*string)(&s.Direction), false)
	case sfUnit:
		return d.stringField((*string)(&s.Unit), false)
	case sfMode:
		return d.stringField((*string)(&s.Mode), false)
	case sfReason:
		return d.stringField(&s.Reason, false)
	case sfTime:
		return d.timeField(&s.Time, true)
	case sfPeriodStart:
		return d.timeField(&s.PeriodStart, false)
	case sfPeriodEnd:
		return d.timeField(&s.PeriodEnd, false)
	case sfPredictedExhaustion:
		var t time.Time
		reason, err = d.timeField(&t, false)
		if !t.IsZero() {
			s.PredictedExhaustion = &t
		}
		return reason, err
	case sfTier:
		return d.smallIntField(&s.Tier, MaxTier, "MaxTier")
	case sfPreviousTier:
		return d.smallIntField(&s.PreviousTier, MaxTier, "MaxTier")
	case sfUsed:
		return d.floatField(&s.Used)
	case sfLimit:
		return d.floatField(&s.Limit)
	case sfRate:
		return d.floatField(&s.Rate)
	case sfSource:
		return d.signalSource(&s.Source, errs)
	case sfAttributes:
		return d.attributes(&s.Attributes, errs, "")
	}
	panic("schemas: decodeSignalField: unhandled field")
}

// timeField decodes an RFC 3339 string; null is allowed when not required.
func (d *scanner) timeField(dst *time.Time, required bool) (reason string, err *SyntaxError) {
	if d.peek() != '"' {
		var ignored string
		return d.stringField(&ignored, required)
	}
	s, bad, err := d.readString()
	if bad != "" || err != nil {
		return bad, err
	}
	*dst, reason = parseTime(s)
	return reason, nil
}

// smallIntField decodes an integer that must fit in an int.
func (d *scanner) smallIntField(dst *int, max int64, limitName string) (reason string, err *SyntaxError) {
	var v int64
	reason, err = d.intField(&v, false, max, limitName)
	if reason == "" && err == nil {
		if v < -1<<31 || v > 1<<31-1 {
			return "is " + strconv.FormatInt(v, 10) + ", out of range; the maximum is " + strconv.FormatInt(max, 10) + " (" + limitName + ")", nil
		}
		*dst = int(v)
	}
	return reason, err
}

// floatField decodes any JSON number; null leaves dst zero.
func (d *scanner) floatField(dst *float64) (reason string, err *SyntaxError) {
	switch c := d.peek(); {
	case c == '-' || c >= '0' && c <= '9':
		num, err := d.readNumber()
		if err != nil {
			return "", err
		}
		v, perr := strconv.ParseFloat(num, 64)
		if perr != nil {
			return "is " + shorten(num) + ", beyond the range of a 64-bit float", nil
		}
		*dst = v
		return "", nil
	case c == 'n':
		_, err = d.readLiteral()
		return "", err
	default:
		return "must be a number, not " + describe(c), d.skipValue(0)
	}
}

// signalSource decodes the source object; unknown members are skipped for
// the same reason as unknown signal fields.
func (d *scanner) signalSource(dst *SignalSource, errs *ValidationError) (reason string, err *SyntaxError) {
	switch c := d.peek(); c {
	case '{':
	case 'n':
		_, err = d.readLiteral()
		return "", err
	default:
		return "must be an object, not " + describe(c), d.skipValue(0)
	}
	d.pos++
	d.skipWS()
	if d.peek() == '}' {
		d.pos++
		return "", nil
	}
	var seen [3]bool
	for {
		key, err := d.readKey()
		if err != nil {
			return "", err
		}
		var reason string
		idx := -1
		switch key {
		case "partition":
			idx = 0
		case "from_offset":
			idx = 1
		case "to_offset":
			idx = 2
		}
		switch {
		case idx < 0:
			err = d.skipValue(0)
		case seen[idx]:
			reason, err = "appears more than once; send each field once", d.skipValue(0)
		case idx == 0:
			var v int64
			reason, err = d.intField(&v, false, 1<<31-1, "the int32 range")
			if reason == "" && err == nil {
				if v < -1<<31 || v > 1<<31-1 {
					reason = "is " + strconv.FormatInt(v, 10) + ", out of range; the maximum is 2147483647 (the int32 range)"
				} else {
					dst.Partition = int32(v)
				}
			}
		case idx == 1:
			reason, err = d.intField(&dst.FromOffset, false, 1<<63-1, "the int64 range")
		default:
			reason, err = d.intField(&dst.ToOffset, false, 1<<63-1, "the int64 range")
		}
		if idx >= 0 {
			seen[idx] = true
		}
		if reason != "" {
			errs.add("", "source."+pathKey(key), reason)
		}
		if err != nil {
			return "", err
		}
		done, err := d.next()
		if err != nil || done {
			return "", err
		}
	}
}
