package eventjson

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func TestAppendUsageEventJSONRoundTrip(t *testing.T) {
	events := []schemas.UsageEvent{schematest.ValidEvent()}
	for _, name := range []string{"event-minimal.json", "event-typical.json", "event-full.json"} {
		var ev schemas.UsageEvent
		if err := DecodeUsageEvent(schematest.ReadTestdata(t, name), &ev); err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	odd := schematest.ValidEvent()
	odd.User = "quote\" backslash\\ newline\n tab\t nul\x00 bell\x07 é 😀 \u2028 </script>"
	odd.Time = time.Date(2024, 5, 1, 12, 0, 0, 1, time.FixedZone("x", -5*3600))
	odd.Estimated = true
	odd.Attributes = map[string]string{"z": "1", "a": "\"", "m": ""}
	events = append(events, odd)

	for i, ev := range events {
		out := AppendUsageEventJSON(nil, &ev)
		var back schemas.UsageEvent
		if err := DecodeUsageEvent(out, &back); err != nil {
			t.Fatalf("event %d: %s does not decode: %v", i, out, err)
		}
		if !schematest.EqualEvents(&ev, &back) {
			t.Errorf("event %d changed:\n%+v\n%+v", i, ev, back)
		}
		// encoding/json must read the same thing: the output is plain JSON.
		var std schemas.UsageEvent
		if err := json.Unmarshal(out, &std); err != nil || !schematest.EqualEvents(&ev, &std) {
			t.Errorf("event %d: encoding/json reads %+v, %v", i, std, err)
		}
		// Canonical: encoding the decoded event gives the same bytes.
		if again := AppendUsageEventJSON(nil, &back); string(again) != string(out) {
			t.Errorf("event %d not canonical:\n%s\n%s", i, out, again)
		}
	}
}

func TestAppendUsageEventJSONCanonical(t *testing.T) {
	ev := schematest.ValidEvent()
	ev.Attributes = map[string]string{"b": "2", "a": "1"}
	ev.Outcome = schemas.OutcomeOK
	got := string(AppendUsageEventJSON([]byte("prefix:"), &ev))
	want := `prefix:{"id":"evt-1","time":"2024-05-01T12:00:00.25Z","tenant":"acme","model":"gpt-4o","prompt_tokens":1200,"completion_tokens":350,"outcome":"ok","attributes":{"a":"1","b":"2"}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestAppendStringInvalidUTF8(t *testing.T) {
	got := string(appendString(nil, "a\xffb\x01"))
	if got != `"a\ufffdb\u0001"` {
		t.Errorf("got %s", got)
	}
	if !strings.HasPrefix(string(appendString(nil, "\u2028")), "\"\u2028") {
		t.Error("U+2028 should pass through")
	}
}

func TestAppendUsageEventJSONAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	ev := schematest.ValidEvent()
	ev.Attributes = map[string]string{"b": "2", "a": "1", "c": "3"}
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { buf = AppendUsageEventJSON(buf[:0], &ev) }); n != 0 {
		t.Errorf("AppendUsageEventJSON allocates %v times", n)
	}
}
