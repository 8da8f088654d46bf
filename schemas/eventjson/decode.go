package eventjson

import (
	"strconv"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// DecodeUsageEvent decodes one usage event v1 from a JSON object and
// validates it. It resets ev first, so a reused schemas.UsageEvent never
// keeps a field from the previous event.
//
// It is strict, because a gateway bug found at ingest is cheap and one found
// in an invoice is not:
//
//   - An unknown field is an error naming it: usage event v1 keeps custom
//     data in attributes and never drops a field silently.
//   - A value of the wrong type ("prompt_tokens": "12"), a number that is not
//     whole or does not fit, a duplicate field and a missing required field
//     are errors naming the field.
//   - null for an optional field means the field is absent.
//   - Anything after the object other than whitespace is an error.
//
// Problems with fields are collected, the event is then run through
// [schemas.UsageEvent.Validate], and all of them come back together as one
// [schemas.ValidationError]. Input that is not well-formed JSON stops the
// decoder and comes back alone as a [*schemas.SyntaxError] with the byte
// offset.
//
// The event's strings share one copy of data, made once per call; data
// itself is not retained and may be reused by the caller. Decoding a typical
// event allocates only that copy.
func DecodeUsageEvent(data []byte, ev *schemas.UsageEvent) error {
	return decodeUsageEvent(scanner{s: string(data)}, ev)
}

// decodeUsageEvent is DecodeUsageEvent on a scanner whose string the event
// may share.
func decodeUsageEvent(d scanner, ev *schemas.UsageEvent) error {
	*ev = schemas.UsageEvent{}
	if err := d.startObject("a usage event", "one JSON object"); err != nil {
		return err
	}
	return d.eventObject(ev, true)
}

// eventObject decodes and validates the event object at the cursor. With
// whole, only whitespace may follow it; without, the cursor is left just
// past the object, for a caller that frames a batch.
func (d *scanner) eventObject(ev *schemas.UsageEvent, whole bool) error {
	var errs schemas.ValidationError
	seen, bad, err := d.decodeEvent(ev, &errs, "")
	if err != nil {
		return err
	}
	if whole {
		d.skipWS()
		if d.pos != len(d.s) {
			return d.syntaxError("unexpected data after the event object; send one object per request or use a batch")
		}
	}
	bad |= reportMissing(&errs, "", schemas.RequiredEventFields&^seen)
	ev.ValidateFields(&errs, "", bad|d.verified)
	return errs.Err()
}

// reportMissing adds a problem for each field in missing and returns it, so
// that validation does not report the same fields again.
func reportMissing(errs *schemas.ValidationError, prefix string, missing schemas.EventField) schemas.EventField {
	for f := schemas.EventField(1); f <= missing; f <<= 1 {
		if missing&f != 0 {
			errs.Add(prefix, f.Name(), "is required")
		}
	}
	return missing
}

// decodeEvent decodes the object at the cursor into ev. It returns the
// fields it saw and those it already reported as bad; problems go to errs
// with names prefixed by prefix.
func (d *scanner) decodeEvent(ev *schemas.UsageEvent, errs *schemas.ValidationError, prefix string) (seen, bad schemas.EventField, err *schemas.SyntaxError) {
	d.pos++ // '{'
	d.verified = 0
	d.skipWS()
	if d.peek() == '}' {
		d.pos++
		return 0, 0, nil
	}
	for {
		key, err := d.readKey()
		if err != nil {
			return seen, bad, err
		}
		f := schemas.EventFieldNamed(key)
		switch {
		case f == 0:
			errs.Add(prefix, schemas.FieldPath(key), "is not a field of usage event v1; put custom labels in attributes")
			err = d.skipValue(0)
		case seen&f != 0:
			errs.Add(prefix, schemas.FieldPath(key), "appears more than once; send each field once")
			bad |= f
			err = d.skipValue(0)
		default:
			seen |= f
			var reason string
			reason, err = d.decodeField(ev, f, errs, prefix)
			if reason != "" {
				errs.Add(prefix, key, reason)
				bad |= f
			}
		}
		if err != nil {
			return seen, bad, err
		}
		done, err := d.next()
		if err != nil || done {
			return seen, bad, err
		}
	}
}

// decodeField decodes the value at the cursor into field f of ev. A reason
// reports a problem with the value; err a syntax error.
func (d *scanner) decodeField(ev *schemas.UsageEvent, f schemas.EventField, errs *schemas.ValidationError, prefix string) (reason string, err *schemas.SyntaxError) {
	switch f {
	case schemas.FieldID:
		return d.stringField(&ev.ID, true)
	case schemas.FieldTenant:
		return d.stringField(&ev.Tenant, true)
	case schemas.FieldModel:
		return d.stringField(&ev.Model, true)
	case schemas.FieldUser:
		return d.freeString(&ev.User, f)
	case schemas.FieldAPIKeyID:
		return d.freeString(&ev.APIKeyID, f)
	case schemas.FieldProvider:
		return d.freeString(&ev.Provider, f)
	case schemas.FieldEndpoint:
		return d.freeString(&ev.Endpoint, f)
	case schemas.FieldSessionID:
		return d.freeString(&ev.SessionID, f)
	case schemas.FieldGateway:
		return d.freeString(&ev.Gateway, f)
	case schemas.FieldRequestedModel:
		return d.stringField(&ev.RequestedModel, false)
	case schemas.FieldOutcome:
		return d.stringField((*string)(&ev.Outcome), false)
	case schemas.FieldPriority:
		return d.stringField((*string)(&ev.Priority), false)
	case schemas.FieldTime:
		var s string
		if reason, err = d.stringField(&s, true); reason != "" || err != nil {
			return reason, err
		}
		ev.Time, reason = scalar.ParseTime(s)
		return reason, nil
	case schemas.FieldPromptTokens:
		return d.intField(&ev.PromptTokens, true, schemas.MaxTokensPerEvent, "schemas.MaxTokensPerEvent")
	case schemas.FieldCompletionTokens:
		return d.intField(&ev.CompletionTokens, true, schemas.MaxTokensPerEvent, "schemas.MaxTokensPerEvent")
	case schemas.FieldCachedTokens:
		return d.intField(&ev.CachedTokens, false, schemas.MaxTokensPerEvent, "schemas.MaxTokensPerEvent")
	case schemas.FieldCacheWriteTokens:
		return d.intField(&ev.CacheWriteTokens, false, schemas.MaxTokensPerEvent, "schemas.MaxTokensPerEvent")
	case schemas.FieldReasoningTokens:
		return d.intField(&ev.ReasoningTokens, false, schemas.MaxTokensPerEvent, "schemas.MaxTokensPerEvent")
	case schemas.FieldLatencyMS:
		return d.intField(&ev.LatencyMS, false, schemas.MaxLatencyMS, "schemas.MaxLatencyMS")
	case schemas.FieldStatus:
		var v int64
		reason, err = d.intField(&v, false, schemas.MaxStatus, "schemas.MaxStatus")
		if reason == "" && err == nil {
			if v < -1<<31 || v > 1<<31-1 {
				return "is out of range; send an HTTP status code from 100 to 599", nil
			}
			ev.Status = int(v)
		}
		return reason, err
	case schemas.FieldEstimated:
		switch c := d.peek(); c {
		case 't', 'f', 'n':
			lit, err := d.readLiteral()
			ev.Estimated = lit == 't'
			return "", err
		default:
			return "must be true or false, not " + scalar.Kind(c), d.skipValue(0)
		}
	case schemas.FieldAttributes:
		return d.attributes(&ev.Attributes, errs, prefix)
	}
	panic("schemas: decodeField: unhandled field " + f.Name())
}

// stringField decodes a string value. null leaves dst empty and is allowed
// only when the field is optional.
func (d *scanner) stringField(dst *string, required bool) (reason string, err *schemas.SyntaxError) {
	switch c := d.peek(); c {
	case '"':
		var bad string
		*dst, bad, err = d.readString()
		return bad, err
	case 'n':
		if _, err = d.readLiteral(); err != nil || !required {
			return "", err
		}
		return "is required and cannot be null", nil
	default:
		return "must be a string, not " + scalar.Kind(c), d.skipValue(0)
	}
}

// freeString decodes one of the optional free-form strings and marks field
// f verified when the value is short ASCII, which cannot break a rule;
// anything else is left to validation.
func (d *scanner) freeString(dst *string, f schemas.EventField) (reason string, err *schemas.SyntaxError) {
	reason, err = d.stringField(dst, false)
	if reason == "" && err == nil && d.ascii && len(*dst) <= schemas.MaxStringLen {
		d.verified |= f
	}
	return reason, err
}

// intField decodes an integer value; see stringField for null.
func (d *scanner) intField(dst *int64, required bool, max int64, limitName string) (reason string, err *schemas.SyntaxError) {
	switch c := d.peek(); {
	case c == '-' || c >= '0' && c <= '9':
		num, err := d.readNumber()
		if err != nil {
			return "", err
		}
		*dst, reason = scalar.ParseInt(num, max, limitName)
		return reason, nil
	case c == 'n':
		if _, err = d.readLiteral(); err != nil || !required {
			return "", err
		}
		return "is required and cannot be null", nil
	default:
		return "must be an integer, not " + scalar.Kind(c), d.skipValue(0)
	}
}

// attributes decodes the attributes object. The map is made only when the
// first entry arrives, so events without attributes allocate none; it comes
// from d.maps when a BatchDecoder has emptied maps to give.
//
// Each entry is checked as it is read, while its bytes are at hand: when
// every entry passes, schemas.FieldAttributes is marked verified and
// validation does not walk the map again. Any problem leaves the field to
// validation, which reports the problems in its own stable order.
func (d *scanner) attributes(dst *map[string]string, errs *schemas.ValidationError, prefix string) (reason string, err *schemas.SyntaxError) {
	switch c := d.peek(); c {
	case '{':
	case 'n':
		_, err = d.readLiteral()
		return "", err
	default:
		return "must be an object of strings, not " + scalar.Kind(c), d.skipValue(0)
	}
	d.pos++
	d.skipWS()
	if d.peek() == '}' {
		d.pos++
		return "", nil
	}
	// total counts every entry. Past MaxAttributes entries
	// the rest are read for well-formedness only: neither the map nor the
	// problems grow with a hostile body (an 8 MiB object of tiny entries
	// used to become a 769,000-entry map).
	clean, total := true, 0
	// At most maxAttributeProblems entries are named, so that the count of
	// entries (reported last) still fits under MaxProblemsPerEvent.
	problems := 0
	addProblem := func(field, reason string) {
		if problems < maxAttributeProblems {
			errs.Add(prefix, field, reason)
		}
		problems++
	}
	for {
		key, err := d.readKey()
		if err != nil {
			return "", err
		}
		total++
		if total > schemas.MaxAttributes {
			if err := d.skipValue(0); err != nil {
				return "", err
			}
		} else if c := d.peek(); c != '"' {
			clean = false
			addProblem("attributes."+schemas.FieldPath(key), "must be a string, not "+scalar.Kind(c))
			if err := d.skipValue(0); err != nil {
				return "", err
			}
		} else {
			val, bad, err := d.readString()
			if err != nil {
				return "", err
			}
			_, dup := (*dst)[key]
			switch {
			case dup:
				clean = false
				addProblem("attributes."+schemas.FieldPath(key), "appears more than once; send each key once")
			case bad != "":
				clean = false
				addProblem("attributes."+schemas.FieldPath(key), bad)
			default:
				if *dst == nil {
					*dst = d.attributeMap()
				}
				(*dst)[key] = val
				if clean && !schemas.AttributeValid(key, val) {
					clean = false
				}
			}
		}
		done, err := d.next()
		if err != nil {
			return "", err
		}
		if done {
			if total > schemas.MaxAttributes {
				return "has " + strconv.Itoa(total) + " entries; the maximum is " + strconv.Itoa(schemas.MaxAttributes) + " (MaxAttributes): keep attributes to a few labels", nil
			}
			if clean {
				d.verified |= schemas.FieldAttributes
			}
			return "", nil
		}
	}
}

// maxAttributeProblems is how many attribute entries one event's error
// names; MaxAttributes of them would crowd out the other fields' problems.
const maxAttributeProblems = 8

// attributeMap returns an empty map for an event's attributes: a recycled
// one when there is one, else a new one.
func (d *scanner) attributeMap() map[string]string {
	if d.maps != nil {
		if n := len(*d.maps); n > 0 {
			m := (*d.maps)[n-1]
			(*d.maps)[n-1] = nil
			*d.maps = (*d.maps)[:n-1]
			return m
		}
	}
	return make(map[string]string, 4)
}
