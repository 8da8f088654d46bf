package eventjson

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/framing"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

// decoded is what one batch element came to: an event or an error.
type decoded struct {
	index int
	ev    schemas.UsageEvent
	err   string
}

// viaSplit is the reference: SplitJSONArray, then each element decoded on
// its own with the package-level decoders.
func viaSplit(body []byte, ce bool) ([]decoded, string) {
	var out []decoded
	err := framing.SplitJSONArray(body, func(i int, raw []byte) error {
		var r decoded
		r.index = i
		var e error
		if ce {
			e = DecodeCloudEvent(raw, &r.ev)
		} else {
			e = DecodeUsageEvent(raw, &r.ev)
		}
		if e != nil {
			r.err = fmt.Sprintf("%T %v", e, e)
		}
		out = append(out, r)
		return nil
	})
	return out, fmt.Sprint(err)
}

// viaBatch decodes body with d.DecodeJSONArray, then recycles every event's
// map into d, so that a following call reuses them.
func viaBatch(d *BatchDecoder, body []byte, ce bool) ([]decoded, string) {
	var out []decoded
	d.Reset(body)
	err := d.DecodeJSONArray(ce, func(i int, decode func(*schemas.UsageEvent) error) error {
		var r decoded
		r.index = i
		if e := decode(&r.ev); e != nil {
			r.err = fmt.Sprintf("%T %v", e, e)
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		// The element at which framing broke was not passed to fn by
		// SplitJSONArray; drop it when decode reported the frame error.
		if n := len(out); n > 0 && out[n-1].err == fmt.Sprintf("%T %v", err, err) {
			out = out[:n-1]
		}
	}
	results := make([]decoded, len(out))
	for i, r := range out {
		results[i] = r
		// Keep a private copy of the attributes before the map goes back.
		if r.ev.Attributes != nil {
			m := make(map[string]string, len(r.ev.Attributes))
			for k, v := range r.ev.Attributes {
				m[k] = v
			}
			d.Recycle(r.ev.Attributes)
			results[i].ev.Attributes = m
		}
	}
	d.Reset(nil)
	return results, fmt.Sprint(err)
}

// sameDecoding fails unless d.DecodeJSONArray agrees with the reference on
// body: the same elements, events, errors and final error.
func sameDecoding(t *testing.T, d *BatchDecoder, body []byte, ce bool) {
	t.Helper()
	want, wantErr := viaSplit(body, ce)
	got, gotErr := viaBatch(d, body, ce)
	if gotErr != wantErr {
		t.Fatalf("final error: got %s, want %s\nbody %q", gotErr, wantErr, body)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d elements, want %d\nbody %q", len(got), len(want), body)
	}
	for i := range want {
		if got[i].err != want[i].err {
			t.Fatalf("element %d: error %s, want %s\nbody %q", i, got[i].err, want[i].err, body)
		}
		if !schematest.EqualEvents(&got[i].ev, &want[i].ev) {
			t.Fatalf("element %d: event %+v, want %+v\nbody %q", i, got[i].ev, want[i].ev, body)
		}
	}
}

// batchBodies builds arrays of corpus documents, well-formed and broken.
func batchBodies(docs []string) [][]byte {
	all := "[" + strings.Join(docs, ",") + "]"
	bodies := [][]byte{
		[]byte(all),
		[]byte("[\n " + strings.Join(docs, " ,\n ") + "\n]\n"),
		[]byte(`[]`), []byte(` [ ] `), []byte(`[`), []byte(`[1,`), []byte(`{}`), []byte(``),
		[]byte(`[{"id":"a"} x]`), []byte(`[{"id":"a"}]x`), []byte(`[{"id":"a"`), []byte(`[{"a":1 , {"b":2}]`),
		[]byte(`[{"id":"a\"}"}, {]`), []byte(`[{"attributes":{"a":[1,{"b":]}}]`), []byte(`[{"x":"` + "\x01" + `"},{}]`),
		[]byte(`[1, "x", null, [], {"id": 1e999}]`), []byte(`[{"id":"a"}{"id":"b"}]`),
	}
	for _, doc := range docs {
		bodies = append(bodies, []byte("["+doc+"]"), []byte("["+doc+","+doc+"]"))
	}
	return bodies
}

func corpusDocs(cases []schematest.Case) []string {
	docs := make([]string, len(cases))
	for i, tc := range cases {
		docs[i] = tc.Doc
	}
	return docs
}

// TestDecodeJSONArrayAgrees holds the one-pass batch decoder to the verdicts,
// events and errors of SplitJSONArray plus DecodeUsageEvent or
// DecodeCloudEvent, on the whole corpus and on broken frames, with maps
// recycled from one body to the next.
func TestDecodeJSONArrayAgrees(t *testing.T) {
	var d BatchDecoder
	usage := append(corpusDocs(schematest.UsageCorpus), string(schematest.ReadTestdata(t, "event-full.json")), string(schematest.ReadTestdata(t, "event-typical.json")))
	for _, body := range batchBodies(usage) {
		sameDecoding(t, &d, body, false)
	}
	for _, body := range batchBodies(corpusDocs(schematest.CloudEventCorpus)) {
		sameDecoding(t, &d, body, true)
	}
	if len(d.maps) == 0 {
		t.Fatal("no attribute map was recycled; the corpus has events with attributes")
	}
}

// TestBatchDecoderSharesBody checks that elements of the body share its
// copy, that an element from elsewhere is still decoded correctly from a
// copy of its own, and that decoding does not alias the caller's bytes.
func TestBatchDecoderSharesBody(t *testing.T) {
	body := []byte(`[` + schematest.Ev() + `,` + schematest.Ev("id", `"evt-2"`) + `]`)
	var d BatchDecoder
	d.Reset(body)
	var ids []string
	err := framing.SplitJSONArray(body, func(_ int, raw []byte) error {
		var e schemas.UsageEvent
		if err := d.DecodeUsageEvent(raw, &e); err != nil {
			return err
		}
		ids = append(ids, e.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	other := []byte(schematest.Ev("id", `"evt-3"`))
	var e3 schemas.UsageEvent
	if err := d.DecodeUsageEvent(other, &e3); err != nil {
		t.Fatal(err)
	}
	// A sub-slice with a cut capacity is not located in the body either.
	var e1 schemas.UsageEvent
	start := bytes.IndexByte(body[1:], '{') + 1
	end := start + len(schematest.Ev())
	if err := d.DecodeUsageEvent(body[start:end:end], &e1); err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'X' // the caller reuses its buffer
	}
	for i := range other {
		other[i] = 'X'
	}
	if ids[0] != "evt-1" || ids[1] != "evt-2" || e3.ID != "evt-3" || e1.ID != "evt-1" || e1.Tenant != "acme" {
		t.Fatalf("events alias the caller's bytes: %q %q %q %q", ids[0], ids[1], e3.ID, e1.ID)
	}
}

// TestRecycledMapsStartEmpty checks that a recycled map carries nothing
// from its previous event, and that large maps are not kept.
func TestRecycledMapsStartEmpty(t *testing.T) {
	var d BatchDecoder
	first := []byte(schematest.Ev("attributes", `{"team":"search","region":"eu"}`))
	second := []byte(schematest.Ev("attributes", `{"feature":"chat"}`))
	var e schemas.UsageEvent
	d.Reset(first)
	if err := d.DecodeUsageEvent(first, &e); err != nil {
		t.Fatal(err)
	}
	d.Recycle(e.Attributes)
	d.Reset(second)
	if err := d.DecodeUsageEvent(second, &e); err != nil {
		t.Fatal(err)
	}
	if len(e.Attributes) != 1 || e.Attributes["feature"] != "chat" {
		t.Fatalf("attributes of a recycled map: %v", e.Attributes)
	}
	if len(d.maps) != 0 {
		t.Fatalf("the recycled map was not used: %d spare", len(d.maps))
	}
	big := make(map[string]string)
	for i := range maxRecycledEntries + 1 {
		big[fmt.Sprint(i)] = "v"
	}
	d.Recycle(big)
	d.Recycle(nil)
	if len(d.maps) != 0 {
		t.Fatalf("kept a map of %d entries or a nil map", len(big))
	}
}

// FuzzDecodeJSONArray holds the one-pass batch decoder to the two-pass
// reference on arbitrary bodies, as usage events and as CloudEvents.
func FuzzDecodeJSONArray(f *testing.F) {
	for _, body := range batchBodies(corpusDocs(schematest.UsageCorpus)) {
		f.Add(body)
	}
	for _, body := range batchBodies(corpusDocs(schematest.CloudEventCorpus)) {
		f.Add(body)
	}
	f.Add(schematest.ReadTestdata(f, "batch.json"))
	f.Add(schematest.ReadTestdata(f, "cloudevents-batch.json"))
	var d BatchDecoder
	f.Fuzz(func(t *testing.T, body []byte) {
		sameDecoding(t, &d, body, false)
		sameDecoding(t, &d, body, true)
	})
}

// batchSink receives decoded events through a method value, as ingest does,
// so that the decode function escapes the way it does there.
type batchSink struct{ evs []schemas.UsageEvent }

func (s *batchSink) add(i int, decode func(*schemas.UsageEvent) error) error {
	return decode(&s.evs[i])
}

// TestDecodeJSONArrayAllocations checks that a body costs a few
// allocations in all (the copy made by Reset among them), not some per
// event.
func TestDecodeJSONArrayAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	body := schematest.TypicalBatch(t, 100)
	sink := &batchSink{evs: make([]schemas.UsageEvent, 100)}
	var d BatchDecoder
	n := testing.AllocsPerRun(20, func() {
		d.Reset(body)
		if err := d.DecodeJSONArray(false, sink.add); err != nil {
			t.Fatal(err)
		}
	})
	if n > 5 {
		t.Errorf("DecodeJSONArray allocates %v times for 100 events; want a handful per body", n)
	}
}
