// Package payload turns the body of a POST /v1/events request into usage
// events: it reads the body (optionally gzip-encoded) within a byte limit,
// frames it by content type (one JSON object, a JSON array, NDJSON, one
// CloudEvent or a CloudEvents batch) within an event-count limit, decodes
// and validates every event with the schemas module, and checks each
// event's time against a window around now and its tenant against the
// caller's scope.
//
// A broken event is rejected alone, with its index, its id when it could be
// read, and every reason; its neighbours are still accepted. Only a broken
// frame (an array that does not close, a body over a limit) fails the whole
// request, because past that point nothing can be attributed to an event.
package payload

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/schemas/framing"
)

// Format is how a body frames its events.
type Format uint8

// The formats POST /v1/events accepts, by Content-Type.
const (
	// JSON is application/json: one event object, or an array of them.
	JSON Format = iota + 1
	// NDJSON is application/x-ndjson (also application/ndjson and
	// application/jsonl): one event object per line.
	NDJSON
	// CloudEvent is application/cloudevents+json: one structured-mode
	// CloudEvent.
	CloudEvent
	// CloudEventBatch is application/cloudevents-batch+json: a JSON array of
	// structured-mode CloudEvents.
	CloudEventBatch
)

// UnsupportedError is a Content-Type or Content-Encoding the API does not
// take (HTTP 415).
type UnsupportedError struct{ Msg string }

func (e *UnsupportedError) Error() string { return e.Msg }

// LimitError is a body over a configured limit (HTTP 413). Limit names the
// configuration field.
type LimitError struct {
	Limit string
	Value int64
	Msg   string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s (limit %s = %d)", e.Msg, e.Limit, e.Value)
}

// FormatOf maps a Content-Type header to a Format. An empty header means
// JSON, so that the simplest client works.
func FormatOf(contentType string) (Format, error) {
	if contentType == "" || contentType == "application/json" {
		// The common case, without parsing (which allocates).
		return JSON, nil
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return 0, &UnsupportedError{Msg: fmt.Sprintf("Content-Type %q cannot be parsed: %v", contentType, err)}
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return 0, &UnsupportedError{Msg: fmt.Sprintf("charset %q is not supported; send UTF-8", cs)}
	}
	switch mt {
	case "application/json":
		return JSON, nil
	case "application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines":
		return NDJSON, nil
	case schemas.ContentTypeCloudEvents:
		return CloudEvent, nil
	case schemas.ContentTypeCloudEventsBatch:
		return CloudEventBatch, nil
	}
	return 0, &UnsupportedError{Msg: fmt.Sprintf("Content-Type %q is not supported; send application/json, "+
		"application/x-ndjson, %s or %s", mt, schemas.ContentTypeCloudEvents, schemas.ContentTypeCloudEventsBatch)}
}

var gzipReaders sync.Pool

// InflaterBytes is what one gzip reader holds while it decodes: the
// inflater's 32 KiB window, its Huffman tables and its input buffer
// (49,760 bytes measured with Go 1.26), rounded up. ReadBody reserves it
// for every gzip body, so many small compressed requests at once are
// charged too, not only what they expand to.
const InflaterBytes = 52 << 10

// ReadBody reads r, decoding it as contentEncoding ("", "identity" or
// "gzip"), into buf. It fails with a *LimitError once more than maxBytes
// bytes arrive after decoding, without reading further, so a compressed
// bomb costs at most maxBytes of memory.
//
// reserve, if not nil, is asked for memory before it is used, in bytes of
// memory (not of body): InflaterBytes for a gzip body, then each array
// the body is read into — the part of buf's pooled capacity as it fills,
// and every larger array in full when the body outgrows it (the smaller
// one stays allocated until the collector frees it, so it stays charged).
// Arrays grow by doubling up to maxBytes and never past it, so a body of
// n bytes is charged less than 2n + InflaterBytes. When reserve
// refuses, ReadBody stops and returns ErrBusy. That lets the caller bound
// the memory of all requests together, charging a gzip body by what it
// expands to and a small body little.
func ReadBody(r io.Reader, contentEncoding string, maxBytes int64, buf *bytes.Buffer, reserve func(n int64) bool) error {
	switch strings.ToLower(strings.TrimSpace(contentEncoding)) {
	case "", "identity":
	case "gzip", "x-gzip":
		if reserve != nil && !reserve(InflaterBytes) {
			return ErrBusy
		}
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(r)
		} else {
			err = zr.Reset(r)
		}
		if err != nil {
			return &SyntaxError{Msg: "the body is not valid gzip: " + err.Error()}
		}
		defer gzipReaders.Put(zr)
		r = zr
	default:
		return &UnsupportedError{Msg: fmt.Sprintf("Content-Encoding %q is not supported; send gzip or identity", contentEncoding)}
	}
	n, err := readReserving(r, buf, maxBytes, reserve)
	if errors.Is(err, ErrBusy) {
		return ErrBusy
	}
	if n > maxBytes {
		return &LimitError{Limit: "max_body_bytes", Value: maxBytes, Msg: "the request body is too large after decoding"}
	}
	if err != nil {
		if errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) {
			return &SyntaxError{Msg: "the body is truncated or not valid gzip: " + err.Error()}
		}
		return err
	}
	return nil
}

// ErrBusy is ReadBody's answer when reserve refused memory: the process is
// decoding as much as its budget allows (HTTP 503 with Retry-After).
var ErrBusy = errors.New("payload: decode memory budget exhausted")

// One reservation of a pooled array's capacity covers as many bytes as are
// already covered, between minReserve and maxReserve: a typical 30 KiB
// batch costs two small reservations, a large body one per 256 KiB, and no
// body is charged much more than it holds. minReserve is also the first
// array a body without a pooled one gets.
const (
	minReserve = 16 << 10
	maxReserve = 256 << 10
)

// readReserving reads r into buf (reset, its capacity reused) until EOF,
// or until it holds max bytes and one more is found (it then reports
// max+1, the byte itself not stored, so no array outgrows max), reserving
// memory as ReadBody describes. It returns how many bytes it read.
func readReserving(r io.Reader, buf *bytes.Buffer, max64 int64, reserve func(int64) bool) (int64, error) {
	b := buf.AvailableBuffer()
	covered := int64(cap(b)) // bytes of b's capacity reserved
	if reserve != nil {
		covered = 0
	}
	var err error
	for err == nil && int64(len(b)) < max64 {
		if len(b) == cap(b) {
			// A new array, in full: min(2 × the old, max).
			n := min(max(2*int64(cap(b)), minReserve), max64)
			if reserve != nil && !reserve(n) {
				return int64(len(b)), ErrBusy
			}
			nb := make([]byte, len(b), n)
			copy(nb, b)
			b, covered = nb, n
		}
		if int64(len(b)) >= covered {
			// More of a pooled array's capacity.
			n := min(max(covered, minReserve), maxReserve, int64(cap(b))-covered)
			if !reserve(n) {
				return int64(len(b)), ErrBusy
			}
			covered += n
		}
		var n int
		n, err = r.Read(b[len(b):min(int64(cap(b)), covered, max64)])
		b = b[:len(b)+n]
	}
	*buf = *bytes.NewBuffer(b)
	read := int64(len(b))
	if err == nil {
		// max bytes in: is there one more?
		var one [1]byte
		var n int
		for n == 0 && err == nil {
			n, err = r.Read(one[:])
		}
		read += int64(n)
	}
	if err == io.EOF {
		err = nil
	}
	return read, err
}

// SyntaxError is a body that cannot be framed into events (HTTP 400).
type SyntaxError struct{ Msg string }

func (e *SyntaxError) Error() string { return e.Msg }

// Limits bound one request.
type Limits struct {
	// MaxEvents is the most events one request may carry.
	MaxEvents int
	// MaxPast and MaxFuture bound an event's time around now; zero disables
	// that side.
	MaxPast, MaxFuture time.Duration
}

// Problem is one reason an event was rejected.
type Problem struct {
	// Field is the JSON path of the offending field; empty when the event
	// as a whole is broken (not well-formed JSON).
	Field string `json:"field,omitempty"`
	// Reason says what is wrong and names the limit.
	Reason string `json:"reason"`
}

// MaxProblemsPerRequest bounds the problems one answer names across all its
// rejected events (each event names at most schemas.MaxProblemsPerEvent).
const MaxProblemsPerRequest = 1000

// ProblemsNotListed stands for the problems of an event past
// MaxProblemsPerRequest.
const ProblemsNotListed = "rejected; its problems are not listed because this answer already names MaxProblemsPerRequest = 1000; fix those and send again"

// Rejection is an event that was not accepted.
type Rejection struct {
	// Index is the event's position in the request, from 0.
	Index int `json:"index"`
	// ID is the event's id when it could be read.
	ID string `json:"id,omitempty"`
	// Errors lists every reason.
	Errors []Problem `json:"errors"`
	// Forbidden marks a rejection only because the key may not send for
	// the event's tenant.
	Forbidden bool `json:"-"`
}

// Batch is the outcome of decoding one body: the accepted events with their
// indexes, and the rejected ones. Reuse a Batch with Reset to keep its
// slices and the events' attribute maps.
//
// The strings of all events share one copy of the body (see
// eventjson.BatchDecoder): retaining any of them beyond the request keeps
// the whole copy alive, so clone what you keep. The events, their
// attribute maps included, are valid until the next Reset or Decode.
type Batch struct {
	Events   []schemas.UsageEvent
	Indexes  []int
	Rejected []Rejection
	// Total is the number of events the body framed, accepted or not.
	Total int

	problems int // problems listed in Rejected so far

	dec eventjson.BatchDecoder
}

// Reset empties b for reuse. It hands the events' attribute maps back to
// the decoder, which fills them again with the next body's attributes, so
// nothing may use b's events or their maps after Reset.
func (b *Batch) Reset() {
	for i := range b.Events {
		b.dec.Recycle(b.Events[i].Attributes)
	}
	clear(b.Events) // drop references into the previous request's strings
	b.Events, b.Indexes, b.Rejected, b.Total, b.problems = b.Events[:0], b.Indexes[:0], b.Rejected[:0], 0, 0
}

// Decode frames body as format and decodes every event into b, which it
// resets first. allow, if not nil, says whether the caller may send events
// for a tenant. It returns a *SyntaxError when the frame is broken and a
// *LimitError when the body holds more than lim.MaxEvents events; b is then
// incomplete and must not be used.
func Decode(format Format, body []byte, lim Limits, now time.Time, allow func(tenant string) bool, b *Batch) error {
	b.Reset()
	if firstByte(body) == 0 {
		return &SyntaxError{Msg: "the body is empty; send one event or a batch"}
	}
	d := decoder{b: b, lim: lim, now: now, allow: allow, ce: format == CloudEvent || format == CloudEventBatch}
	b.dec.Reset(body)
	defer b.dec.Reset(nil) // body is the caller's buffer; do not pin it in a pooled Batch
	var err error
	switch format {
	case JSON, CloudEvent:
		first := firstByte(body)
		if format == JSON && first == '[' {
			err = b.dec.DecodeJSONArray(false, d.arrayEvent)
		} else {
			err = d.event(0, body)
		}
	case CloudEventBatch:
		err = b.dec.DecodeJSONArray(true, d.arrayEvent)
	case NDJSON:
		err = framing.SplitNDJSON(body, d.event)
	default:
		return &UnsupportedError{Msg: "unknown format"}
	}
	if err != nil {
		var se *schemas.SyntaxError
		if errors.As(err, &se) {
			return &SyntaxError{Msg: fmt.Sprintf("the body is not a well-formed batch: at byte %d: %s", se.Offset, se.Msg)}
		}
		return err
	}
	if b.Total == 0 {
		return &SyntaxError{Msg: "the body holds no events"}
	}
	return nil
}

func firstByte(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c
	}
	return 0
}

type decoder struct {
	b     *Batch
	lim   Limits
	now   time.Time
	allow func(string) bool
	ce    bool
}

// event decodes one framed event: the whole body, or a line of NDJSON.
func (d *decoder) event(index int, raw []byte) error {
	return d.arrayEvent(index, func(ev *schemas.UsageEvent) error {
		if d.ce {
			return d.b.dec.DecodeCloudEvent(raw, ev)
		}
		return d.b.dec.DecodeUsageEvent(raw, ev)
	})
}

// arrayEvent decodes the event at index with decode and files it as
// accepted or rejected.
func (d *decoder) arrayEvent(index int, decode func(*schemas.UsageEvent) error) error {
	if index >= d.lim.MaxEvents {
		return &LimitError{Limit: "max_events_per_request", Value: int64(d.lim.MaxEvents),
			Msg: "the request holds too many events; split it"}
	}
	d.b.Total = index + 1
	b := d.b
	b.Events = append(b.Events, schemas.UsageEvent{})
	ev := &b.Events[len(b.Events)-1]
	// A broken frame comes back here too; DecodeJSONArray then fails the
	// whole body, whatever is filed for this element.
	err := decode(ev)
	var problems []Problem
	if err != nil {
		var ve schemas.ValidationError
		if errors.As(err, &ve) {
			problems = make([]Problem, 0, len(ve)+1)
			for _, fe := range ve {
				problems = append(problems, Problem{Field: fe.Field, Reason: fe.Reason})
			}
		} else {
			var se *schemas.SyntaxError
			if errors.As(err, &se) {
				problems = []Problem{{Reason: fmt.Sprintf("not well-formed JSON at byte %d of the event: %s", se.Offset, se.Msg)}}
			} else {
				problems = []Problem{{Reason: err.Error()}}
			}
		}
	}
	timeBroken := false
	for _, p := range problems {
		if p.Field == "time" || p.Field == "data.time" {
			timeBroken = true
		}
	}
	if !timeBroken && !ev.Time.IsZero() {
		if fe := schemas.CheckTime(ev.Time, d.now, d.lim.MaxPast, d.lim.MaxFuture); fe != nil {
			limit := "services.ingest.max_event_age"
			if ev.Time.After(d.now) {
				limit = "services.ingest.max_event_future"
			}
			problems = append(problems, Problem{Field: fe.Field, Reason: fe.Reason + " (limit " + limit + ")"})
		}
	}
	forbidden := false
	if len(problems) == 0 && d.allow != nil && !d.allow(ev.Tenant) {
		forbidden = true
		problems = append(problems, Problem{Field: "tenant", Reason: fmt.Sprintf("this API key may not send events for tenant %q", ev.Tenant)})
	}
	if len(problems) > 0 {
		// Every rejected event is listed (index and id), but the answer
		// names at most MaxProblemsPerRequest problems in all: 5,000 events
		// of 21 problems each would make a multi-megabyte answer.
		if room := MaxProblemsPerRequest - b.problems; len(problems) > room {
			if room > 0 {
				problems = append(problems[:room:room], Problem{Reason: ProblemsNotListed})
			} else {
				problems = []Problem{{Reason: ProblemsNotListed}}
			}
		}
		b.problems += len(problems)
		b.Rejected = append(b.Rejected, Rejection{Index: index, ID: ev.ID, Errors: problems, Forbidden: forbidden})
		b.dec.Recycle(ev.Attributes)
		*ev = schemas.UsageEvent{}
		b.Events = b.Events[:len(b.Events)-1]
		return nil
	}
	b.Indexes = append(b.Indexes, index)
	return nil
}
