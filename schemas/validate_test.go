package schemas_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func TestValidateAcceptsValidEvents(t *testing.T) {
	ev := schematest.ValidEvent()
	if err := ev.Validate(); err != nil {
		t.Fatal(err)
	}
	full := schematest.ValidEvent()
	full.User, full.APIKeyID, full.Provider, full.Endpoint = "u", "k", "p", "/v1/chat/completions"
	full.CachedTokens, full.Status, full.Outcome, full.LatencyMS = 1200, 599, schemas.OutcomeTimeout, schemas.MaxLatencyMS
	full.Priority, full.SessionID, full.Estimated, full.Gateway = schemas.PriorityLow, "s", true, "gw"
	full.Attributes = map[string]string{"k": strings.Repeat("v", schemas.MaxAttributeValueLen)}
	full.ID = strings.Repeat("x", schemas.MaxIDLen)
	full.Tenant = strings.Repeat("t", schemas.MaxTenantLen)
	full.Model = strings.Repeat("m", schemas.MaxModelLen)
	full.PromptTokens, full.CompletionTokens = schemas.MaxTokensPerEvent, 0
	if err := full.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidateRules breaks one rule per case and checks that the problem is
// reported for the right field, with the limit in the message.
func TestValidateRules(t *testing.T) {
	manyAttrs := map[string]string{}
	for i := range schemas.MaxAttributes + 1 {
		manyAttrs["k"+strconv.Itoa(i)] = "v"
	}
	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []struct {
		name   string
		mutate func(*schemas.UsageEvent)
		field  string
		want   []string // substrings of the reason
	}{
		{"id empty", func(e *schemas.UsageEvent) { e.ID = "" }, "id", []string{"required", "128"}},
		{"id too long", func(e *schemas.UsageEvent) { e.ID = long(schemas.MaxIDLen + 1) }, "id", []string{"129", "128", "MaxIDLen"}},
		{"id space", func(e *schemas.UsageEvent) { e.ID = "a b" }, "id", []string{"0x20", "without spaces"}},
		{"id non-ascii", func(e *schemas.UsageEvent) { e.ID = "é" }, "id", []string{"0xC3"}},
		{"time zero", func(e *schemas.UsageEvent) { e.Time = time.Time{} }, "time", []string{"required", "RFC 3339"}},
		{"time before 1970", func(e *schemas.UsageEvent) { e.Time = time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC) }, "time", []string{"1970"}},
		{"time after 9999", func(e *schemas.UsageEvent) { e.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "time", []string{"2105"}},
		{"time after 2105", func(e *schemas.UsageEvent) { e.Time = time.Date(2106, 1, 1, 0, 0, 0, 0, time.UTC) }, "time", []string{"2106-01-01", schemas.MaxEventTimeText, "ClickHouse"}},
		{"tenant empty", func(e *schemas.UsageEvent) { e.Tenant = "" }, "tenant", []string{"required", "64"}},
		{"tenant too long", func(e *schemas.UsageEvent) { e.Tenant = long(schemas.MaxTenantLen + 1) }, "tenant", []string{"65", "64", "MaxTenantLen"}},
		{"tenant bad char", func(e *schemas.UsageEvent) { e.Tenant = "acme/prod" }, "tenant", []string{"0x2F", "offset 4"}},
		{"model empty", func(e *schemas.UsageEvent) { e.Model = "" }, "model", []string{"required", "128"}},
		{"model too long", func(e *schemas.UsageEvent) { e.Model = long(schemas.MaxModelLen + 1) }, "model", []string{"129", "128", "MaxModelLen"}},
		{"model control char", func(e *schemas.UsageEvent) { e.Model = "gpt\n4" }, "model", []string{"0x0A"}},
		{"model reserved star", func(e *schemas.UsageEvent) { e.Model = "*" }, "model", []string{`"*"`, "reserved", "every model"}},
		{"model reserved at", func(e *schemas.UsageEvent) { e.Model = "@v" }, "model", []string{`"@v"`, "reserved", "@"}},
		{"prompt negative", func(e *schemas.UsageEvent) { e.PromptTokens = -1 }, "prompt_tokens", []string{"-1", "negative"}},
		{"prompt too big", func(e *schemas.UsageEvent) { e.PromptTokens = schemas.MaxTokensPerEvent + 1 }, "prompt_tokens", []string{"1000000000", "MaxTokensPerEvent"}},
		{"completion negative", func(e *schemas.UsageEvent) { e.CompletionTokens = -5 }, "completion_tokens", []string{"negative"}},
		{"completion too big", func(e *schemas.UsageEvent) { e.CompletionTokens = 2e9 }, "completion_tokens", []string{"1000000000"}},
		{"cached negative", func(e *schemas.UsageEvent) { e.CachedTokens = -1 }, "cached_tokens", []string{"negative"}},
		{"cached too big", func(e *schemas.UsageEvent) { e.CachedTokens = schemas.MaxTokensPerEvent + 1 }, "cached_tokens", []string{"1000000000"}},
		{"cached above prompt", func(e *schemas.UsageEvent) { e.CachedTokens = e.PromptTokens + 1 }, "cached_tokens", []string{"1201", "prompt_tokens is 1200"}},
		{"status too low", func(e *schemas.UsageEvent) { e.Status = 99 }, "status", []string{"99", "100", "599"}},
		{"status too high", func(e *schemas.UsageEvent) { e.Status = 600 }, "status", []string{"600", "599"}},
		{"status negative", func(e *schemas.UsageEvent) { e.Status = -200 }, "status", []string{"100 to 599"}},
		{"outcome unknown", func(e *schemas.UsageEvent) { e.Outcome = "success" }, "outcome", []string{`"success"`, "ok, error, timeout, rejected"}},
		{"priority unknown", func(e *schemas.UsageEvent) { e.Priority = "urgent" }, "priority", []string{`"urgent"`, "critical, high, normal, low"}},
		{"latency negative", func(e *schemas.UsageEvent) { e.LatencyMS = -1 }, "latency_ms", []string{"3600000"}},
		{"latency too big", func(e *schemas.UsageEvent) { e.LatencyMS = schemas.MaxLatencyMS + 1 }, "latency_ms", []string{"3600001", "3600000", "MaxLatencyMS"}},
		{"user too long", func(e *schemas.UsageEvent) { e.User = long(schemas.MaxStringLen + 1) }, "user", []string{"257", "256", "MaxStringLen"}},
		{"api_key_id too long", func(e *schemas.UsageEvent) { e.APIKeyID = long(300) }, "api_key_id", []string{"256"}},
		{"provider too long", func(e *schemas.UsageEvent) { e.Provider = long(300) }, "provider", []string{"256"}},
		{"endpoint too long", func(e *schemas.UsageEvent) { e.Endpoint = long(300) }, "endpoint", []string{"256"}},
		{"session_id too long", func(e *schemas.UsageEvent) { e.SessionID = long(300) }, "session_id", []string{"256"}},
		{"gateway too long", func(e *schemas.UsageEvent) { e.Gateway = long(300) }, "gateway", []string{"256"}},
		{"user invalid utf8", func(e *schemas.UsageEvent) { e.User = "\xff" }, "user", []string{"UTF-8"}},
		{"too many attributes", func(e *schemas.UsageEvent) { e.Attributes = manyAttrs }, "attributes", []string{"33", "32", "MaxAttributes"}},
		{"attribute key empty", func(e *schemas.UsageEvent) { e.Attributes = map[string]string{"": "v"} }, "attributes", []string{"empty key", "64"}},
		{"attribute key too long", func(e *schemas.UsageEvent) { e.Attributes = map[string]string{long(65): "v"} }, "attributes." + long(65), []string{"65", "64", "MaxAttributeKeyLen"}},
		{"attribute key space", func(e *schemas.UsageEvent) { e.Attributes = map[string]string{"a b": "v"} }, "attributes.a b", []string{"0x20"}},
		{"attribute value too long", func(e *schemas.UsageEvent) { e.Attributes = map[string]string{"team": long(257)} }, "attributes.team", []string{"257", "256", "MaxAttributeValueLen"}},
		{"attribute value invalid utf8", func(e *schemas.UsageEvent) { e.Attributes = map[string]string{"team": "\xc3"} }, "attributes.team", []string{"UTF-8"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := schematest.ValidEvent()
			tc.mutate(&ev)
			err := ev.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			schematest.WantFieldError(t, err, tc.field, tc.want...)
			if ve := schematest.FieldErrors(t, err); len(ve) != 1 {
				t.Errorf("want exactly one problem, got %v", err)
			}
		})
	}
}

func TestValidateReportsEverything(t *testing.T) {
	ev := schematest.ValidEvent()
	ev.Tenant = ""
	ev.PromptTokens = -1
	ev.Outcome = "nope"
	ev.Attributes = map[string]string{"b b": "x", "a a": "y"}
	ve := schematest.FieldErrors(t, ev.Validate())
	want := []string{"tenant", "prompt_tokens", "outcome", "attributes.a a", "attributes.b b"}
	if len(ve) != len(want) {
		t.Fatalf("want %d problems, got %v", len(want), ve)
	}
	for i, f := range want {
		if ve[i].Field != f {
			t.Errorf("problem %d is for %s, want %s", i, ve[i].Field, f)
		}
	}
	msg := ve.Error()
	if !strings.HasPrefix(msg, "schemas: 5 invalid fields: tenant: ") {
		t.Errorf("message %q", msg)
	}
}

func TestValidateDoesNotAllocate(t *testing.T) {
	ev := schematest.ValidEvent()
	ev.Attributes = map[string]string{"team": "search"}
	if n := testing.AllocsPerRun(100, func() { _ = ev.Validate() }); n != 0 {
		t.Errorf("Validate allocates %v times", n)
	}
}

func TestTotalTokens(t *testing.T) {
	ev := schematest.ValidEvent()
	ev.CachedTokens = 1000
	if got := ev.TotalTokens(); got != 1550 {
		t.Errorf("TotalTokens = %d, want 1550", got)
	}
}

func TestCheckTime(t *testing.T) {
	now := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		t       time.Time
		ok      bool
		mention string
	}{
		{now, true, ""},
		{now.Add(5 * time.Minute), true, ""},
		{now.Add(-48 * time.Hour), true, ""},
		{now.Add(6 * time.Minute), false, "future; at most 5m0s"},
		{now.Add(-49 * time.Hour), false, "past; at most 48h0m0s"},
	}
	for _, tc := range cases {
		fe := schemas.CheckTime(tc.t, now, 48*time.Hour, 5*time.Minute)
		if (fe == nil) != tc.ok {
			t.Errorf("CheckTime(%v) = %v, want ok=%v", tc.t, fe, tc.ok)
			continue
		}
		if fe != nil && (fe.Field != "time" || !strings.Contains(fe.Reason, tc.mention)) {
			t.Errorf("CheckTime(%v) = %v, want field time mentioning %q", tc.t, fe, tc.mention)
		}
	}
	if fe := schemas.CheckTime(now.Add(1000*time.Hour), now, 0, 0); fe != nil {
		t.Errorf("zero bounds must disable the check, got %v", fe)
	}
}

func TestOutcomePriorityValid(t *testing.T) {
	for _, o := range []schemas.Outcome{schemas.OutcomeOK, schemas.OutcomeError, schemas.OutcomeTimeout, schemas.OutcomeRejected} {
		if !o.Valid() {
			t.Errorf("%q not valid", o)
		}
	}
	for _, p := range []schemas.Priority{schemas.PriorityCritical, schemas.PriorityHigh, schemas.PriorityNormal, schemas.PriorityLow} {
		if !p.Valid() {
			t.Errorf("%q not valid", p)
		}
	}
	if schemas.Outcome("").Valid() || schemas.Priority("OK").Valid() {
		t.Error("empty or unknown values reported valid")
	}
}
