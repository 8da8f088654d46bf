package eventjson

import (
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/framing"
)

// maxSpareMaps bounds the emptied attribute maps a BatchDecoder keeps: about
// 340 bytes each, so at most some 2.7 MB per decoder. Maps recycled beyond
// it are dropped and left to the garbage collector.
const maxSpareMaps = 8192

// maxRecycledEntries is the most entries a map may have held to be kept for
// reuse: up to eight a map is one group of slots, and a larger map would
// keep its larger table, so it is dropped instead.
const maxRecycledEntries = 8

// BatchDecoder decodes the events of one request body, as [DecodeUsageEvent]
// and [DecodeCloudEvent] do, with two costs taken off each event:
//
//   - The strings of all events decoded from the body share one string copy
//     of it, made by Reset, instead of one copy per event. An event's
//     strings therefore keep the whole body's copy alive for as long as any
//     of them is referenced; callers that retain a single string for long
//     (a dedup index) should clone it.
//   - Attribute maps handed back with Recycle are emptied and filled again
//     by later events instead of being allocated anew.
//
// Results and errors are exactly those of DecodeUsageEvent and
// DecodeCloudEvent on the same element. A BatchDecoder is not safe for
// concurrent use; its zero value is ready after Reset.
type BatchDecoder struct {
	data []byte // the caller's body, to locate elements in it
	s    string // one copy of data, shared by the decoded events
	maps []map[string]string
}

// Reset prepares d for the body data, copying it once. data must not change
// until the events of this body are decoded: elements passed to the Decode
// methods are located in data and read from the copy. Reset(nil) drops the
// references to the previous body; recycled maps are kept either way.
func (d *BatchDecoder) Reset(data []byte) {
	d.data = data
	d.s = string(data)
}

// DecodeUsageEvent is [DecodeUsageEvent] for elem, an element of the body
// given to Reset as [framing.SplitJSONArray] and [framing.SplitNDJSON] pass
// it. An elem that is not a sub-slice of that body is decoded from a copy of
// its own.
func (d *BatchDecoder) DecodeUsageEvent(elem []byte, ev *schemas.UsageEvent) error {
	return decodeUsageEvent(d.scanner(elem), ev)
}

// DecodeCloudEvent is [DecodeCloudEvent] for elem; see DecodeUsageEvent.
func (d *BatchDecoder) DecodeCloudEvent(elem []byte, ev *schemas.UsageEvent) error {
	return decodeCloudEvent(d.scanner(elem), ev)
}

// Recycle gives d an attribute map that the caller no longer uses, neither
// directly nor through an event, so that a later event's attributes fill it
// instead of a new map. d empties it. Maps that held more than eight
// entries, and maps beyond a bound of a few thousand, are not kept.
func (d *BatchDecoder) Recycle(m map[string]string) {
	if m == nil || len(m) > maxRecycledEntries || len(d.maps) >= maxSpareMaps {
		return
	}
	clear(m)
	d.maps = append(d.maps, m)
}

// scanner returns a scanner over elem that shares d's copy of the body when
// elem lies inside it. The body's bytes are compared by address, not by
// content: cap(elem) tells where a sub-slice starts, and the address check
// rules out a slice of some other array that happens to fit.
func (d *BatchDecoder) scanner(elem []byte) scanner {
	sc := scanner{maps: &d.maps}
	if len(elem) == 0 {
		return sc
	}
	off := cap(d.data) - cap(elem)
	if off >= 0 && off+len(elem) <= len(d.data) && &d.data[off] == &elem[0] {
		sc.s = d.s[off : off+len(elem)]
	} else {
		sc.s = string(elem)
	}
	return sc
}

// DecodeJSONArray is [framing.SplitJSONArray] and decoding in one pass, for the
// body given to Reset. For each element it calls fn with the element's
// index and a decode function, which decodes the element into ev as the
// Decode methods do (as a CloudEvent when cloudEvents is set) and returns
// the element's own error, if any. fn calls decode at most once.
//
// SplitJSONArray followed by a decode reads every byte twice: once to find
// where the element ends, once to decode it. Here a well-formed element is
// decoded straight from the body and its end is where decoding stopped;
// only an element that is not well-formed is framed separately, then
// decoded alone so that its error is exactly the one DecodeUsageEvent
// gives. Verdicts, errors and offsets are those of SplitJSONArray followed
// by the Decode methods.
//
// Broken framing returns a [*schemas.SyntaxError] with the offset in the
// body, as SplitJSONArray does; decode returns that error too when it meets
// it. If fn returns an error, DecodeJSONArray stops and returns it, except
// that broken framing of the same element wins, as it would have been found
// first by SplitJSONArray.
func (d *BatchDecoder) DecodeJSONArray(cloudEvents bool, fn func(index int, decode func(ev *schemas.UsageEvent) error) error) error {
	// One decode closure for the whole body: made per element, it would
	// escape through fn and cost an allocation per event.
	var start, end int
	decode := func(ev *schemas.UsageEvent) error {
		if d.s[start] == '{' {
			*ev = schemas.UsageEvent{}
			sc := scanner{s: d.s, pos: start, maps: &d.maps}
			var err error
			if cloudEvents {
				err = sc.cloudEventObject(ev, false)
			} else {
				err = sc.eventObject(ev, false)
			}
			if _, broken := err.(*schemas.SyntaxError); !broken {
				end = sc.pos
				return err
			}
		}
		// Not a well-formed object: frame it, then decode it alone.
		elemEnd, err := framing.ValueEnd(d.data, start)
		if err != nil {
			return err // framing.EachElement meets and returns it too
		}
		end = elemEnd
		elem := scanner{s: d.s[start:end], maps: &d.maps}
		if cloudEvents {
			return decodeCloudEvent(elem, ev)
		}
		return decodeUsageEvent(elem, ev)
	}
	return framing.EachElement(d.data, func(index, elemStart int) (int, error) {
		start, end = elemStart, -1 // -1 until decode finds the end; EachElement frames the rest
		err := fn(index, decode)
		return end, err
	})
}
