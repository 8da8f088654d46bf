package schemas

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// Signals are encoded with encoding/json and decoded by hand: a burst of
// 10,000 signals through encoding/json's Decoder cost the enforcer about
// half a second of CPU (56 µs and 312 allocations a signal), where the
// walker of signal_scan.go and the judges below take a few microseconds and
// a handful of allocations. encoding/json alone would be too lenient for a
// contract besides: it matches keys without regard to case, lets the last
// of two duplicate keys win, turns a lone UTF-16 surrogate into U+FFFD and
// rejects 90.0 as an int. DecodeSignal therefore walks the object's members
// itself and judges each value with the rules usage events follow; the
// tests hold it to the verdicts of the same judges fed by encoding/json's
// Decoder (signal_json_ref_test.go).

// EncodeSignal validates s and returns its JSON encoding, the record value
// of [TopicSignalsV1]. An invalid signal is not encoded: a producer that
// emitted it would hand every consumer a poison record.
//
// The struct tags of [Signal] are the wire format: numbers that are zero,
// optional strings that are empty and unset times are left out.
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
// It ignores fields it does not know, where the usage event decoder rejects
// them. Signals are produced inside Sluice, and the aggregator that adds an
// optional field to signal v1 is deployed before or after the enforcer and
// the alerter that read them; a strict decoder would turn every such
// additive change into an outage of the consumers. Usage events come from
// outside, where an unknown field is a sender's mistake that would otherwise
// lose data. Duplicate fields are rejected here too, because which of two
// values wins is not something to leave to a parser.
//
// A signal whose kind this version does not know is decoded completely and
// reported as a problem with "kind", so that the consumer can log and skip
// it.
func DecodeSignal(data []byte, s *Signal) error {
	// One copy of the input: the signal's strings share it.
	return decodeSignal(string(data), s, eachMember)
}

// walkFunc walks the members of the JSON object data, calling member with
// each key and value text in order; what names the object in syntax errors.
// eachMember is the one DecodeSignal uses; the tests pass one built on
// encoding/json's Decoder as the reference.
type walkFunc func(data, what string, member func(key, raw string)) error

// decodeSignal is DecodeSignal with the member walker as a parameter, so
// that the tests can hold the walker to a reference through the same
// judges.
func decodeSignal(data string, s *Signal, walk walkFunc) error {
	*s = Signal{}
	var errs ValidationError
	var seen, bad signalField
	err := walk(data, "a signal", func(key, raw string) {
		f := signalFieldNamed(key)
		reason := ""
		switch {
		case f == 0:
			return // forward compatibility: see above
		case seen&f != 0:
			reason = duplicate
		default:
			seen |= f
			reason = s.decodeField(f, raw, walk, &errs)
		}
		if reason != "" {
			errs.Add("", key, reason)
			bad |= f
		}
	})
	if err != nil {
		return err
	}
	s.validate(&errs, bad)
	return errs.Err()
}

// duplicate is the problem of a key that appears twice in one object.
const duplicate = "appears more than once; send each field once"

// decodeField decodes raw, a well-formed JSON value, into field f of s and
// returns the reason it does not fit, or "".
func (s *Signal) decodeField(f signalField, raw string, walk walkFunc, errs *ValidationError) (reason string) {
	switch f {
	case sfID:
		return stringValue(raw, &s.ID, true)
	case sfKind:
		return stringValue(raw, (*string)(&s.Kind), true)
	case sfTenant:
		return stringValue(raw, &s.Tenant, true)
	case sfModel:
		return stringValue(raw, &s.Model, true)
	case sfQuota:
		return stringValue(raw, (*string)(&s.Quota), false)
	case sfPeriod:
		return stringValue(raw, (*string)(&s.Period), false)
	case sfDirection:
		return stringValue(raw, (*string)(&s.Direction), false)
	case sfUnit:
		return stringValue(raw, (*string)(&s.Unit), false)
	case sfMode:
		return stringValue(raw, (*string)(&s.Mode), false)
	case sfReason:
		return stringValue(raw, &s.Reason, false)
	case sfTime:
		return timeValue(raw, &s.Time, true)
	case sfPeriodStart:
		return timeValue(raw, &s.PeriodStart, false)
	case sfPeriodEnd:
		return timeValue(raw, &s.PeriodEnd, false)
	case sfPredictedExhaustion:
		var t time.Time
		reason = timeValue(raw, &t, false)
		if !t.IsZero() {
			s.PredictedExhaustion = &t
		}
		return reason
	case sfTier:
		return intValue(raw, &s.Tier, MaxTier, "MaxTier")
	case sfPreviousTier:
		return intValue(raw, &s.PreviousTier, MaxTier, "MaxTier")
	case sfUsed:
		return floatValue(raw, &s.Used)
	case sfLimit:
		return floatValue(raw, &s.Limit)
	case sfRate:
		return floatValue(raw, &s.Rate)
	case sfSource:
		return s.Source.decode(raw, walk, errs)
	case sfAttributes:
		return attributesValue(raw, &s.Attributes, walk, errs)
	}
	panic("schemas: Signal.decodeField: unhandled field " + strconv.Itoa(int(f)))
}

// decode decodes the source object. Unknown members are skipped for the
// same reason as unknown signal fields; problems are reported as
// source.<member>.
func (src *SignalSource) decode(raw string, walk walkFunc, errs *ValidationError) (reason string) {
	if raw[0] != '{' {
		return nullOr(raw, "must be an object, not ")
	}
	var seen uint8
	_ = walk(raw, "source", func(key, raw string) {
		var bit uint8
		switch key {
		case "partition":
			bit = 1
		case "from_offset":
			bit = 2
		case "to_offset":
			bit = 4
		default:
			return // unknown members are skipped
		}
		if seen&bit != 0 {
			errs.Add("source.", key, duplicate)
			return
		}
		seen |= bit
		var reason string
		switch key {
		case "partition":
			var v int
			if reason = intValue(raw, &v, 1<<31-1, "the int32 range"); reason == "" {
				src.Partition = int32(v)
			}
		case "from_offset":
			reason = int64Value(raw, &src.FromOffset, 1<<63-1, "the int64 range")
		case "to_offset":
			reason = int64Value(raw, &src.ToOffset, 1<<63-1, "the int64 range")
		}
		if reason != "" {
			errs.Add("source.", key, reason)
		}
	})
	return ""
}

// attributesValue decodes an attributes object; problems are reported as
// attributes.<key>.
func attributesValue(raw string, dst *map[string]string, walk walkFunc, errs *ValidationError) (reason string) {
	if raw[0] != '{' {
		return nullOr(raw, "must be an object of strings, not ")
	}
	var seen []string // a few keys: no map
	_ = walk(raw, "attributes", func(key, raw string) {
		var val string
		again := slices.Contains(seen, key)
		if !again {
			seen = append(seen, key)
		}
		if again {
			errs.Add("attributes.", FieldPath(key), "appears more than once; send each key once")
		} else if raw[0] != '"' {
			errs.Add("attributes.", FieldPath(key), "must be a string, not "+scalar.Kind(raw[0]))
		} else if reason := stringValue(raw, &val, true); reason != "" {
			errs.Add("attributes.", FieldPath(key), reason)
		} else {
			if *dst == nil {
				*dst = make(map[string]string)
			}
			(*dst)[key] = val
		}
	})
	return ""
}

// nullOr returns "" when raw is null, which leaves an optional field
// absent, and otherwise mustBe followed by the type raw has.
func nullOr(raw string, mustBe string) string {
	if raw[0] == 'n' {
		return ""
	}
	return mustBe + scalar.Kind(raw[0])
}

// stringValue decodes a JSON string into dst. null leaves dst empty and is
// allowed only when the field is optional. Text that is not valid Unicode
// is a problem here, because encoding/json would quietly replace it with
// U+FFFD and validation would never see it.
func stringValue(raw string, dst *string, required bool) (reason string) {
	switch raw[0] {
	case '"':
	case 'n':
		if required {
			return "is required and cannot be null"
		}
		return ""
	default:
		return "must be a string, not " + scalar.Kind(raw[0])
	}
	if strings.IndexByte(raw, '\\') < 0 { // nothing to unescape: share the input
		if !utf8.ValidString(raw) {
			return invalidUTF8
		}
		*dst = raw[1 : len(raw)-1]
		return ""
	}
	switch {
	case !utf8.ValidString(raw):
		return invalidUTF8
	case scalar.LoneSurrogate(raw):
		return scalar.LoneSurrogateReason
	}
	*dst = unquote(raw)
	return ""
}

const invalidUTF8 = "is not valid UTF-8; send text encoded in UTF-8"

// timeValue decodes an RFC 3339 string into dst; see stringValue for null.
func timeValue(raw string, dst *time.Time, required bool) (reason string) {
	var s string
	if reason := stringValue(raw, &s, required); reason != "" || raw[0] == 'n' {
		return reason
	}
	*dst, reason = scalar.ParseTime(s)
	return reason
}

// int64Value decodes a whole number of at most max into dst; null leaves
// it zero.
func int64Value(raw string, dst *int64, max int64, limitName string) (reason string) {
	switch c := raw[0]; {
	case c == 'n':
		return ""
	case c != '-' && (c < '0' || c > '9'):
		return "must be an integer, not " + scalar.Kind(c)
	}
	*dst, reason = scalar.ParseInt(raw, max, limitName)
	return reason
}

// intValue is int64Value for a field that must fit in 32 bits.
func intValue(raw string, dst *int, max int64, limitName string) (reason string) {
	var v int64
	if reason = int64Value(raw, &v, max, limitName); reason != "" {
		return reason
	}
	if v < -1<<31 || v > 1<<31-1 {
		return "is " + strconv.FormatInt(v, 10) + ", out of range; the maximum is " + strconv.FormatInt(max, 10) + " (" + limitName + ")"
	}
	*dst = int(v)
	return ""
}

// floatValue decodes any JSON number into dst; null leaves it zero.
func floatValue(raw string, dst *float64) (reason string) {
	switch c := raw[0]; {
	case c == 'n':
		return ""
	case c != '-' && (c < '0' || c > '9'):
		return "must be a number, not " + scalar.Kind(c)
	}
	v, err := strconv.ParseFloat(raw, 64)
	if err != nil {
		return "is " + scalar.Shorten(raw) + ", beyond the range of a 64-bit float"
	}
	*dst = v
	return ""
}
