package payload

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var lim = Limits{MaxEvents: 100, MaxPast: 24 * time.Hour, MaxFuture: 5 * time.Minute}

func ev(id, tenant string) string {
	return fmt.Sprintf(`{"id":%q,"time":"2026-11-29T11:59:00Z","tenant":%q,"model":"gpt-4o","prompt_tokens":10,"completion_tokens":5}`, id, tenant)
}

func ce(id, tenant string) string {
	return fmt.Sprintf(`{"specversion":"1.0","type":"dev.sluice.usage.v1","source":"//gw/eu-1","id":%q,"time":"2026-11-29T11:59:00Z","data":{"tenant":%q,"model":"m","prompt_tokens":1,"completion_tokens":2}}`, id, tenant)
}

func decode(t *testing.T, contentType, body string, allow func(string) bool) (*Batch, error) {
	t.Helper()
	f, err := FormatOf(contentType)
	if err != nil {
		t.Fatalf("FormatOf(%q): %v", contentType, err)
	}
	var b Batch
	return &b, Decode(f, []byte(body), lim, now, allow, &b)
}

func TestEveryFormatDecodes(t *testing.T) {
	cases := []struct{ ct, body string }{
		{"application/json", ev("a", "acme")},
		{"", ev("a", "acme")},
		{"application/json; charset=utf-8", "[" + ev("a", "acme") + "," + ev("b", "acme") + "]"},
		{"application/x-ndjson", ev("a", "acme") + "\n\n" + ev("b", "acme") + "\r\n"},
		{"application/cloudevents+json", ce("a", "acme")},
		{"application/cloudevents-batch+json", "[" + ce("a", "acme") + "," + ce("b", "acme") + "]"},
	}
	for _, c := range cases {
		b, err := decode(t, c.ct, c.body, nil)
		if err != nil || len(b.Rejected) != 0 || len(b.Events) != b.Total || b.Events[0].ID != "a" || b.Events[0].Tenant != "acme" {
			t.Errorf("%s: err=%v batch=%+v", c.ct, err, b)
		}
	}
}

func TestMixedBatchRejectsOnlyBadEventsWithEveryReason(t *testing.T) {
	body := "[" + strings.Join([]string{
		ev("good-1", "acme"),
		`{"id":"bad-1","time":"2026-11-29T11:59:00Z","tenant":"acme","model":"m","prompt_tokens":-1,"completion_tokens":"x"}`,
		ev("good-2", "acme"),
		`{"id":"bad-2","time":"2030-01-01T00:00:00Z","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":1}`,
		`{"id":"bad-3", "tenant": tru}`,
		ev("old", "acme")[:len(ev("old", "acme"))-1] + `,"surprise":1}`,
	}, ",") + "]"
	b, err := decode(t, "application/json", body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || b.Events[0].ID != "good-1" || b.Events[1].ID != "good-2" || b.Indexes[0] != 0 || b.Indexes[1] != 2 {
		t.Fatalf("accepted %+v at %v, want good-1@0 and good-2@2", b.Events, b.Indexes)
	}
	if len(b.Rejected) != 4 {
		t.Fatalf("rejected %+v, want 4", b.Rejected)
	}
	r := b.Rejected[0]
	if r.Index != 1 || r.ID != "bad-1" || len(r.Errors) != 2 {
		t.Errorf("rejection %+v: want index 1, id bad-1 and both token reasons", r)
	}
	if r := b.Rejected[1]; r.Index != 3 || r.Errors[0].Field != "time" || !strings.Contains(r.Errors[0].Reason, "future") {
		t.Errorf("future event: %+v", r)
	}
	if r := b.Rejected[2]; r.Index != 4 || !strings.Contains(r.Errors[0].Reason, "well-formed") {
		t.Errorf("broken element: %+v", r)
	}
	if r := b.Rejected[3]; r.Index != 5 || r.Errors[0].Field != "surprise" {
		t.Errorf("unknown field: %+v", r)
	}
}

func TestTimeWindow(t *testing.T) {
	old := strings.Replace(ev("a", "acme"), "2026-11-29T11:59:00Z", "2026-11-27T11:59:00Z", 1)
	b, err := decode(t, "application/json", old, nil)
	if err != nil || len(b.Rejected) != 1 || !strings.Contains(b.Rejected[0].Errors[0].Reason, "max_event_age") {
		t.Fatalf("event two days old: err=%v rejected=%+v", err, b.Rejected)
	}
}

func TestTenantScope(t *testing.T) {
	b, err := decode(t, "application/x-ndjson", ev("a", "acme")+"\n"+ev("b", "evil"), func(t string) bool { return t == "acme" })
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || len(b.Rejected) != 1 || !b.Rejected[0].Forbidden || b.Rejected[0].ID != "b" {
		t.Fatalf("scope: events=%d rejected=%+v", len(b.Events), b.Rejected)
	}
}

func TestFrameErrorsAndLimits(t *testing.T) {
	for _, body := range []string{"[" + ev("a", "acme"), "[]", "", "  "} {
		_, err := decode(t, "application/json", body, nil)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("body %q: err = %v, want SyntaxError", body, err)
		}
	}
	many := "[" + strings.Repeat(ev("x", "acme")+",", lim.MaxEvents) + ev("x", "acme") + "]"
	_, err := decode(t, "application/json", many, nil)
	var le *LimitError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "max_events_per_request = 100") {
		t.Fatalf("101 events: err = %v, want a LimitError naming max_events_per_request", err)
	}
	if _, err := FormatOf("application/x-www-form-urlencoded"); err == nil || !strings.Contains(err.Error(), "application/x-ndjson") {
		t.Errorf("form content type: err = %v, want one listing the supported types", err)
	}
}

func TestReadBody(t *testing.T) {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(bytes.Repeat([]byte("a"), 10_000))
	zw.Close()

	var buf bytes.Buffer
	if err := ReadBody(bytes.NewReader(z.Bytes()), "gzip", 10_000, &buf, nil); err != nil || buf.Len() != 10_000 {
		t.Fatalf("gzip within limit: err=%v len=%d", err, buf.Len())
	}
	buf.Reset()
	err := ReadBody(bytes.NewReader(z.Bytes()), "gzip", 9_999, &buf, nil)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "max_body_bytes" {
		t.Fatalf("gzip bomb over the limit: err = %v, want a LimitError naming max_body_bytes", err)
	}
	buf.Reset()
	var se *SyntaxError
	if err := ReadBody(strings.NewReader("not gzip"), "gzip", 100, &buf, nil); !errors.As(err, &se) {
		t.Fatalf("bad gzip: err = %v", err)
	}
	var ue *UnsupportedError
	if err := ReadBody(strings.NewReader("x"), "br", 100, &buf, nil); !errors.As(err, &ue) {
		t.Fatalf("brotli: err = %v", err)
	}
}

// TestReadBodyReserves: decoded bytes are reserved before they are read,
// a chunk at a time and never beyond max_body_bytes; a refusal stops the
// read with ErrBusy however much more the gzip stream would expand to.
func TestReadBodyReserves(t *testing.T) {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(make([]byte, 4<<20))
	zw.Close()
	for _, tc := range []struct {
		name      string
		max, have int64
		wantBusy  bool
	}{
		{"budget covers the limit", 1 << 20, 2<<20 + InflaterBytes, false},
		{"budget below the body", 1 << 20, 600 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reserved int64
			reserve := func(n int64) bool {
				if reserved+n > tc.have {
					return false
				}
				reserved += n
				return true
			}
			var buf bytes.Buffer
			err := ReadBody(bytes.NewReader(z.Bytes()), "gzip", tc.max, &buf, reserve)
			if tc.wantBusy {
				if !errors.Is(err, ErrBusy) {
					t.Fatalf("err = %v, want ErrBusy", err)
				}
				if int64(buf.Len()) > reserved {
					t.Fatalf("read %d bytes with %d reserved", buf.Len(), reserved)
				}
				return
			}
			var le *LimitError
			if !errors.As(err, &le) {
				t.Fatalf("err = %v, want the max_body_bytes LimitError", err)
			}
			// The arrays the body was read into (the last of
			// max_body_bytes, the smaller ones before it) and the
			// inflater: what the request allocated, no more.
			if reserved < tc.max+InflaterBytes || reserved > 2*tc.max+InflaterBytes {
				t.Fatalf("reserved %d bytes, want the arrays of a %d-byte body and the inflater, at most %d", reserved, tc.max, 2*tc.max+InflaterBytes)
			}
		})
	}
	// A small body is charged a small reservation, not a large chunk.
	var reserved int64
	var buf bytes.Buffer
	small := ev("a", "acme")
	if err := ReadBody(strings.NewReader(small), "", 8<<20, &buf, func(n int64) bool { reserved += n; return true }); err != nil || buf.String() != small {
		t.Fatalf("small body: %v %q", err, buf.String())
	}
	if reserved > 16<<10 {
		t.Fatalf("a %d-byte body reserved %d bytes", len(small), reserved)
	}
}

// FuzzDecode feeds arbitrary bodies in every format: the parser must never
// panic, must account for every framed event exactly once (accepted or
// rejected), and every accepted event must be valid and re-encode to an
// event that decodes to itself.
func FuzzDecode(f *testing.F) {
	f.Add(uint8(JSON), []byte("["+ev("a", "acme")+","+ev("b", "b")+"]"))
	f.Add(uint8(JSON), []byte(ev("a", "acme")))
	f.Add(uint8(NDJSON), []byte(ev("a", "acme")+"\n{}\n"))
	f.Add(uint8(CloudEvent), []byte(ce("a", "acme")))
	f.Add(uint8(CloudEventBatch), []byte("["+ce("a", "acme")+",{]"))
	f.Add(uint8(JSON), []byte(`[{"id":"x\"]","tenant":[[[[{}]]]]}]`))
	f.Fuzz(func(t *testing.T, format uint8, body []byte) {
		fm := Format(format%4 + 1)
		var b Batch
		err := Decode(fm, body, lim, now, func(s string) bool { return s != "forbidden" }, &b)
		if err != nil {
			return
		}
		if len(b.Events)+len(b.Rejected) != b.Total || len(b.Events) != len(b.Indexes) {
			t.Fatalf("accounted %d accepted + %d rejected of %d framed", len(b.Events), len(b.Rejected), b.Total)
		}
		for i := range b.Events {
			e := &b.Events[i]
			if err := e.Validate(); err != nil {
				t.Fatalf("accepted an invalid event: %v", err)
			}
			var back schemas.UsageEvent
			if err := eventjson.DecodeUsageEvent(eventjson.AppendUsageEventJSON(nil, e), &back); err != nil {
				t.Fatalf("accepted event does not round-trip: %v", err)
			}
			if back.ID != e.ID || back.Tenant != e.Tenant || back.TotalTokens() != e.TotalTokens() {
				t.Fatalf("round trip changed the event: %+v -> %+v", e, back)
			}
		}
		for _, r := range b.Rejected {
			if len(r.Errors) == 0 {
				t.Fatalf("rejection %d without a reason", r.Index)
			}
		}
	})
}

// TestReusedBatchKeepsEventsApart decodes two bodies into one Batch, as the
// server's pool does: the second body's events must carry only their own
// attributes (maps are recycled between bodies) and their strings must not
// change when the caller reuses the first body's buffer.
func TestReusedBatchKeepsEventsApart(t *testing.T) {
	withAttrs := func(id, attrs string) string {
		return strings.TrimSuffix(ev(id, "acme"), "}") + `,"attributes":` + attrs + `}`
	}
	var b Batch
	first := []byte("[" + withAttrs("a", `{"team":"search","region":"eu"}`) + "," + withAttrs("b", `{"x":"1"}`) + "]")
	if err := Decode(JSON, first, lim, now, nil, &b); err != nil || len(b.Events) != 2 {
		t.Fatalf("first body: %v, %+v", err, b)
	}
	second := []byte("[" + withAttrs("c", `{"feature":"chat"}`) + "," + ev("d", "acme") + "]")
	if err := Decode(JSON, second, lim, now, nil, &b); err != nil || len(b.Events) != 2 {
		t.Fatalf("second body: %v, %+v", err, b)
	}
	for i := range first {
		first[i] = 'X'
	}
	for i := range second {
		second[i] = 'X'
	}
	c, d := b.Events[0], b.Events[1]
	if c.ID != "c" || len(c.Attributes) != 1 || c.Attributes["feature"] != "chat" {
		t.Errorf("event c = %+v", c)
	}
	if d.ID != "d" || d.Attributes != nil {
		t.Errorf("event d = %+v", d)
	}
}

// TestBrokenFrameAfterGoodEvents checks that a body whose array breaks
// after some good events fails as a whole, with the offset in the body.
func TestBrokenFrameAfterGoodEvents(t *testing.T) {
	body := "[" + ev("a", "acme") + "," + ev("b", "acme") + `,{"id":"c"` + "]"
	_, err := decode(t, "application/json", body, nil)
	var se *SyntaxError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "at byte") {
		t.Fatalf("err = %v, want a SyntaxError with a byte offset", err)
	}
}

// TestProblemsPerRequestAreCapped: a request of many events, each with many
// problems, lists every rejected event but names at most
// MaxProblemsPerRequest problems (plus one "not listed" line per event past
// it), so the answer stays small; the good event in it is still accepted.
func TestProblemsPerRequestAreCapped(t *testing.T) {
	const events = 2000
	bad := `{"id":"x","time":"nope","tenant":"","model":"","prompt_tokens":"a","completion_tokens":"b","u1":1,"u2":2,"u3":3,"u4":4,"u5":5}`
	parts := make([]string, 0, events+1)
	for range events {
		parts = append(parts, bad)
	}
	parts = append(parts, ev("good", "acme"))
	var b Batch
	big := Limits{MaxEvents: events + 1}
	if err := Decode(JSON, []byte("["+strings.Join(parts, ",")+"]"), big, now, nil, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Rejected) != events || len(b.Events) != 1 {
		t.Fatalf("%d rejected, %d accepted; want %d and 1", len(b.Rejected), len(b.Events), events)
	}
	problems := 0
	for _, r := range b.Rejected {
		for _, p := range r.Errors {
			if p.Reason != ProblemsNotListed {
				problems++
			}
		}
		if len(r.Errors) == 0 {
			t.Fatalf("rejection %d lists no reason at all", r.Index)
		}
	}
	if problems > MaxProblemsPerRequest {
		t.Fatalf("%d problems named in one answer; at most %d", problems, MaxProblemsPerRequest)
	}
	if last := b.Rejected[len(b.Rejected)-1]; len(last.Errors) != 1 || last.Errors[0].Reason != ProblemsNotListed {
		t.Fatalf("last rejection %+v, want only the not-listed note", last)
	}
}
