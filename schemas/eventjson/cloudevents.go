package eventjson

import (
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// ceAttr bits name the CloudEvents attributes the decoder knows, to find
// duplicates and missing required ones.
type ceAttr uint16

const (
	ceSpecVersion ceAttr = 1 << iota
	ceType
	ceSource
	ceID
	ceTime
	ceSubject
	ceDataContentType
	ceDataSchema
	ceData
)

// DecodeCloudEvent decodes one structured-mode CloudEvent carrying a usage
// event v1 into ev, which it resets first, and validates the result. The
// mapping:
//
//   - specversion must be "1.0" and type must be
//     [schemas.CloudEventTypeUsageV1].
//   - source is required: a URI-reference naming the emitter, usually the
//     gateway, for example "//gateway.example.com/eu-1". It is checked, not
//     stored; put the gateway's name in data.gateway if you want it counted.
//   - id is the usage event's id and time its time; data.id and data.time
//     may be left out, and must be equal to the envelope's when present. If
//     the envelope has no time, data.time is required.
//   - subject, when present, must equal data.tenant.
//   - datacontenttype, when present, must be "application/json".
//   - data is the usage event object with the rules of [DecodeUsageEvent];
//     data_base64 is not accepted.
//   - dataschema is accepted and ignored.
//   - Extension attributes (names of lower-case ASCII letters and digits,
//     with string, number or boolean values) are accepted and ignored, as
//     the CloudEvents spec asks of consumers that do not know them; any
//     other member is an error.
//
// Problems come back together as a [schemas.ValidationError] whose field
// names are the envelope's ("specversion", "id") or the payload's
// ("data.tenant"). JSON that is not well-formed comes back as a
// [*schemas.SyntaxError]. Strings are shared with one copy of data, as in
// DecodeUsageEvent.
func DecodeCloudEvent(data []byte, ev *schemas.UsageEvent) error {
	return decodeCloudEvent(scanner{s: string(data)}, ev)
}

// decodeCloudEvent is DecodeCloudEvent on a scanner whose string the event
// may share.
func decodeCloudEvent(d scanner, ev *schemas.UsageEvent) error {
	*ev = schemas.UsageEvent{}
	if err := d.startObject("a structured CloudEvent", "one CloudEvent as a JSON object"); err != nil {
		return err
	}
	return d.cloudEventObject(ev, true)
}

// cloudEventObject decodes and validates the CloudEvent object at the
// cursor; see eventObject for whole.
func (d *scanner) cloudEventObject(ev *schemas.UsageEvent, whole bool) error {
	var (
		errs                schemas.ValidationError
		seen, bad           ceAttr
		extensions          []string
		envID, subject, tim string
		dataSeen, dataBad   schemas.EventField
	)
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
			a := lookupCEAttr(key)
			var reason string
			switch {
			case a != 0 && seen&a != 0:
				reason, err = "appears more than once; send each attribute once", d.skipValue(0)
			case a == ceData:
				seen |= a
				switch c := d.peek(); c {
				case '{':
					dataSeen, dataBad, err = d.decodeEvent(ev, &errs, "data.")
				case 'n':
					seen &^= ceData // null data is no data
					_, err = d.readLiteral()
				default:
					reason, err = "must be the usage event as a JSON object, not "+scalar.Kind(c), d.skipValue(0)
				}
			case a != 0:
				seen |= a
				reason, err = d.ceAttribute(a, &envID, &tim, &subject)
				if reason == "" && err == nil && a == ceTime && tim == "" {
					seen &^= ceTime // null: absent
				}
			case key == "data_base64":
				reason, err = "is not supported; send the usage event as a JSON object in data", d.skipValue(0)
			case !isExtensionName(key):
				reason, err = "is not a CloudEvents attribute: extension names are lower-case ASCII letters and digits", d.skipValue(0)
			default:
				for _, x := range extensions {
					if x == key {
						reason = "appears more than once; send each attribute once"
					}
				}
				extensions = append(extensions, key)
				switch c := d.peek(); c {
				case '{', '[':
					if reason == "" {
						reason = "must be a string, number or boolean, not " + scalar.Kind(c)
					}
				}
				err = d.skipValue(0)
			}
			if reason != "" {
				errs.Add("", schemas.FieldPath(key), reason)
				bad |= a
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
	if whole {
		d.skipWS()
		if d.pos != len(d.s) {
			return d.syntaxError("unexpected data after the CloudEvent object; send a batch as " + schemas.ContentTypeCloudEventsBatch)
		}
	}
	for _, r := range [...]struct {
		a    ceAttr
		name string
	}{{ceSpecVersion, "specversion"}, {ceType, "type"}, {ceSource, "source"}, {ceID, "id"}} {
		if seen&r.a == 0 {
			errs.Add("", r.name, "is required")
		}
	}
	if seen&ceData == 0 {
		errs.Add("", "data", "is required: the usage event as a JSON object")
	} else if bad&ceData == 0 {
		mergeEnvelope(ev, &errs, seen, bad, envID, tim, subject, dataSeen, dataBad)
		dataBad |= reportMissing(&errs, "data.", (schemas.RequiredEventFields&^(schemas.FieldID|schemas.FieldTime))&^dataSeen)
		ev.ValidateFields(&errs, "data.", dataBad|schemas.FieldID|schemas.FieldTime|d.verified)
	}
	return errs.Err()
}

// mergeEnvelope moves the envelope's id and time into ev and checks that
// subject and the payload agree with the envelope.
func mergeEnvelope(ev *schemas.UsageEvent, errs *schemas.ValidationError, seen, bad ceAttr, envID, tim, subject string, dataSeen, dataBad schemas.EventField) {
	if dataSeen&schemas.FieldID != 0 && dataBad&schemas.FieldID == 0 && seen&ceID != 0 && bad&ceID == 0 && ev.ID != envID {
		errs.Add("", "data.id", `is "`+scalar.Shorten(ev.ID)+`" but the CloudEvents id is "`+envID+`"; they must be equal, or leave data.id out`)
	}
	ev.ID = envID
	switch {
	case bad&ceTime != 0:
	case seen&ceTime != 0: // ceAttribute has checked it
		t, _ := scalar.ParseTime(tim)
		if dataSeen&schemas.FieldTime != 0 && dataBad&schemas.FieldTime == 0 && !ev.Time.Equal(t) {
			errs.Add("", "data.time", "is "+ev.Time.Format(time.RFC3339Nano)+
				" but the CloudEvents time is "+tim+"; they must be the same instant, or leave data.time out")
		}
		ev.Time = t
	case dataSeen&schemas.FieldTime == 0:
		errs.Add("", "time", "is required, as the CloudEvents time or as data.time")
	case dataBad&schemas.FieldTime == 0:
		if reason := schemas.CheckEventTime(ev.Time); reason != "" {
			errs.Add("", "data.time", reason)
		}
	}
	if subject != "" && bad&ceSubject == 0 && dataBad&schemas.FieldTenant == 0 && ev.Tenant != "" && subject != ev.Tenant {
		errs.Add("", "subject", `is "`+scalar.Shorten(subject)+`" but data.tenant is "`+ev.Tenant+`"; the subject, when present, is the tenant`)
	}
}

// ceAttribute decodes the value of a string attribute other than data and
// checks it. null means absent, which only optional attributes may be.
func (d *scanner) ceAttribute(a ceAttr, envID, tim, subject *string) (reason string, err *schemas.SyntaxError) {
	required := a&(ceSpecVersion|ceType|ceSource|ceID) != 0
	if d.peek() != '"' {
		var ignored string
		return d.stringField(&ignored, required)
	}
	val, bad, err := d.readString()
	if bad != "" || err != nil {
		return bad, err
	}
	switch a {
	case ceSpecVersion:
		if val != schemas.CloudEventsSpecVersion {
			return `is "` + scalar.Shorten(val) + `"; only CloudEvents "1.0" is supported`, nil
		}
	case ceType:
		if val != schemas.CloudEventTypeUsageV1 {
			return `is "` + scalar.Shorten(val) + `"; usage events have type "` + schemas.CloudEventTypeUsageV1 + `"`, nil
		}
	case ceSource:
		return checkSource(val), nil
	case ceID:
		*envID = val
		return schemas.CheckID(val), nil
	case ceTime:
		*tim = val
		if val == "" {
			return "is empty; send an RFC 3339 timestamp or leave it out", nil
		}
		t, reason := scalar.ParseTime(val)
		if reason == "" {
			reason = schemas.CheckEventTime(t)
		}
		return reason, nil
	case ceSubject:
		*subject = val
		if val == "" {
			return "is empty; send the tenant or leave it out", nil
		}
	case ceDataContentType:
		if val != "application/json" {
			return `is "` + scalar.Shorten(val) + `"; data must be a JSON object, with datacontenttype "application/json" or none`, nil
		}
	case ceDataSchema:
		if val == "" {
			return "is empty; send a URI or leave it out", nil
		}
	}
	return "", nil
}

func lookupCEAttr(name string) ceAttr {
	switch name {
	case "specversion":
		return ceSpecVersion
	case "type":
		return ceType
	case "source":
		return ceSource
	case "id":
		return ceID
	case "time":
		return ceTime
	case "subject":
		return ceSubject
	case "datacontenttype":
		return ceDataContentType
	case "dataschema":
		return ceDataSchema
	case "data":
		return ceData
	}
	return 0
}

// isExtensionName reports whether name is a valid CloudEvents attribute
// name: lower-case ASCII letters and digits.
func isExtensionName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkSource checks a CloudEvents source, a URI-reference.
func checkSource(s string) string {
	switch {
	case s == "":
		return "is required; send a URI-reference naming the emitter, for example //gateway.example.com/eu-1"
	case len(s) > schemas.MaxStringLen:
		return "is too long; the maximum is 256 bytes (schemas.MaxStringLen)"
	case strings.IndexByte(s, '\\') >= 0:
		return `contains a backslash, which a URI-reference cannot; use "/"`
	}
	u, err := url.Parse(s)
	if err != nil {
		return "is not a URI-reference; send one like //gateway.example.com/eu-1 or urn:sluice:gateway:eu-1"
	}
	if h := u.Hostname(); strings.IndexByte(h, ':') >= 0 {
		if !strings.Contains(u.Host, "[") || net.ParseIP(h) == nil {
			return "has an IPv6 host that is not a valid address in [brackets]"
		}
	}
	return ""
}

// AppendCloudEventJSON appends ev as a structured-mode CloudEvent with the
// given source to dst and returns the extended slice. The envelope carries
// id, time and subject (the tenant) and data carries the whole event as
// [AppendUsageEventJSON] writes it, so that consumers which only look at
// data lose nothing. Validate ev first; source must be a URI-reference.
func AppendCloudEventJSON(dst []byte, source string, ev *schemas.UsageEvent) []byte {
	dst = append(dst, `{"specversion":"1.0","type":"`+schemas.CloudEventTypeUsageV1+`","source":`...)
	dst = appendString(dst, source)
	dst = append(dst, `,"id":`...)
	dst = appendString(dst, ev.ID)
	dst = append(dst, `,"time":"`...)
	dst = ev.Time.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","subject":`...)
	dst = appendString(dst, ev.Tenant)
	dst = append(dst, `,"datacontenttype":"application/json","data":`...)
	dst = AppendUsageEventJSON(dst, ev)
	return append(dst, '}')
}
