package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// Signals are few (one per change of a tenant's quota state), so they go
// through encoding/json rather than a hand-written codec. encoding/json
// alone would be too lenient for a contract, though: it matches keys without
// regard to case, lets the last of two duplicate keys win, turns a lone
// UTF-16 surrogate into U+FFFD and rejects 90.0 as an int. DecodeSignal
// therefore walks the object's members with a json.Decoder and judges each
// value with the rules usage events follow.

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
	*s = Signal{}
	var errs ValidationError
	var bad signalField
	err := eachMember(data, "a signal", func(key string, raw []byte, again bool) {
		f := signalFieldNamed(key)
		reason := ""
		switch {
		case f == 0:
			return // forward compatibility: see above
		case again:
			reason = duplicate
		default:
			reason = s.decodeField(f, raw, &errs)
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

// eachMember checks that data is one JSON object and calls member with each
// of its members in order, telling it whether the key appeared before; what
// names the object in syntax errors. Only the top level can have those: a
// nested object is a value encoding/json has already checked.
func eachMember(data []byte, what string, member func(key string, raw []byte, again bool)) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	syntaxError := func(err error) *SyntaxError {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			return &SyntaxError{Offset: se.Offset, Msg: se.Error()}
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return &SyntaxError{Offset: int64(len(data)), Msg: "unexpected end of input; " + what + " is one JSON object"}
		}
		return &SyntaxError{Offset: dec.InputOffset(), Msg: err.Error()}
	}
	if tok, err := dec.Token(); err != nil {
		return syntaxError(err)
	} else if tok != json.Delim('{') {
		rest := bytes.TrimLeft(data, " \t\r\n")
		return &SyntaxError{Offset: int64(len(data) - len(rest)),
			Msg: what + " is a JSON object, but the input starts with " + scalar.Kind(rest[0])}
	}
	var seen []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		key := tok.(string) // json.Decoder guarantees a key after '{' or ','
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return syntaxError(err)
		}
		again := slices.Contains(seen, key) // a few dozen keys at most: no map
		if !again {
			seen = append(seen, key)
		}
		member(key, raw, again)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return syntaxError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &SyntaxError{Offset: dec.InputOffset(), Msg: "unexpected data after " + what}
	}
	return nil
}

// decodeField decodes raw, a well-formed JSON value, into field f of s and
// returns the reason it does not fit, or "".
func (s *Signal) decodeField(f signalField, raw []byte, errs *ValidationError) (reason string) {
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
		return s.Source.decode(raw, errs)
	case sfAttributes:
		return attributesValue(raw, &s.Attributes, errs)
	}
	panic("schemas: Signal.decodeField: unhandled field " + strconv.Itoa(int(f)))
}

// decode decodes the source object. Unknown members are skipped for the
// same reason as unknown signal fields; problems are reported as
// source.<member>.
func (src *SignalSource) decode(raw []byte, errs *ValidationError) (reason string) {
	if raw[0] != '{' {
		return nullOr(raw, "must be an object, not ")
	}
	_ = eachMember(raw, "source", func(key string, raw []byte, again bool) {
		var reason string
		switch key {
		case "partition", "from_offset", "to_offset":
			if again {
				errs.Add("source.", key, duplicate)
				return
			}
		default:
			return // unknown members are skipped
		}
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
func attributesValue(raw []byte, dst *map[string]string, errs *ValidationError) (reason string) {
	if raw[0] != '{' {
		return nullOr(raw, "must be an object of strings, not ")
	}
	_ = eachMember(raw, "attributes", func(key string, raw []byte, again bool) {
		var val string
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
func nullOr(raw []byte, mustBe string) string {
	if raw[0] == 'n' {
		return ""
	}
	return mustBe + scalar.Kind(raw[0])
}

// stringValue decodes a JSON string into dst. null leaves dst empty and is
// allowed only when the field is optional. Text that is not valid Unicode
// is a problem here, because encoding/json would quietly replace it with
// U+FFFD and validation would never see it.
func stringValue(raw []byte, dst *string, required bool) (reason string) {
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
	switch {
	case !utf8.Valid(raw):
		return "is not valid UTF-8; send text encoded in UTF-8"
	case scalar.LoneSurrogate(raw):
		return scalar.LoneSurrogateReason
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		*dst = string(raw[1 : len(raw)-1]) // nothing to unescape: skip a decoder
		return ""
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		panic("schemas: a string encoding/json checked does not decode: " + err.Error())
	}
	return ""
}

// timeValue decodes an RFC 3339 string into dst; see stringValue for null.
func timeValue(raw []byte, dst *time.Time, required bool) (reason string) {
	var s string
	if reason := stringValue(raw, &s, required); reason != "" || raw[0] == 'n' {
		return reason
	}
	*dst, reason = scalar.ParseTime(s)
	return reason
}

// int64Value decodes a whole number of at most max into dst; null leaves
// it zero.
func int64Value(raw []byte, dst *int64, max int64, limitName string) (reason string) {
	switch c := raw[0]; {
	case c == 'n':
		return ""
	case c != '-' && (c < '0' || c > '9'):
		return "must be an integer, not " + scalar.Kind(c)
	}
	*dst, reason = scalar.ParseInt(string(raw), max, limitName)
	return reason
}

// intValue is int64Value for a field that must fit in 32 bits.
func intValue(raw []byte, dst *int, max int64, limitName string) (reason string) {
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
func floatValue(raw []byte, dst *float64) (reason string) {
	switch c := raw[0]; {
	case c == 'n':
		return ""
	case c != '-' && (c < '0' || c > '9'):
		return "must be a number, not " + scalar.Kind(c)
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return "is " + scalar.Shorten(string(raw)) + ", beyond the range of a 64-bit float"
	}
	*dst = v
	return ""
}
