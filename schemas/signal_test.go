package schemas_test

import (
	. "github.com/sluicehq/sluice/schemas"

	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func validSignal() Signal {
	start := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	return Signal{
		ID: SignalID("tier_crossed", "acme", "*", "monthly_tokens", "2024-05", "90"), Kind: SignalTierCrossed,
		Time: time.Date(2024, 5, 20, 8, 15, 0, 0, time.UTC), Tenant: "acme", Model: "*",
		Quota: QuotaMonthlyTokens, Period: PeriodMonth, PeriodStart: start, PeriodEnd: start.AddDate(0, 1, 0),
		Tier: 90, PreviousTier: 70, Direction: DirectionUp, Used: 9e7, Limit: 1e8, Unit: UnitTokens,
		Rate: 41000, Mode: ModeHard, Reason: "90%", Source: SignalSource{Partition: 3, FromOffset: 10, ToOffset: 12},
	}
}

func TestSignalID(t *testing.T) {
	a := SignalID("tier_crossed", "acme", "90")
	if a != SignalID("tier_crossed", "acme", "90") {
		t.Error("not deterministic")
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Errorf("id %q is not 32 hex digits", a)
	}
	if SignalID("ab", "c") == SignalID("a", "bc") || SignalID("a") == SignalID("a", "") || SignalID() == SignalID("") {
		t.Error("part boundaries are ambiguous")
	}
	if CheckID(a) != "" {
		t.Error("SignalID does not satisfy the id rules")
	}
}

func TestSignalRoundTrip(t *testing.T) {
	s := validSignal()
	pe := time.Date(2024, 5, 28, 0, 0, 0, 0, time.UTC)
	s.PredictedExhaustion = &pe
	s.Attributes = map[string]string{"horizon": "2h"}
	data, err := EncodeSignal(&s)
	if err != nil {
		t.Fatal(err)
	}
	var back Signal
	if err := DecodeSignal(data, &back); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	again, err := EncodeSignal(&back)
	if err != nil || string(again) != string(data) {
		t.Errorf("round trip changed the signal:\n%s\n%s %v", data, again, err)
	}
	if back.PredictedExhaustion == nil || !back.PredictedExhaustion.Equal(pe) || back.Source != s.Source {
		t.Errorf("decoded %+v", back)
	}
}

func TestDecodeSignalTestdata(t *testing.T) {
	for _, name := range []string{"signal-tier-crossed.json", "signal-exhaustion-predicted.json"} {
		var s Signal
		if err := DecodeSignal(schematest.ReadTestdata(t, name), &s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDecodeSignalToleratesUnknownFields(t *testing.T) {
	data, err := EncodeSignal(new(validSignal()))
	if err != nil {
		t.Fatal(err)
	}
	in := strings.Replace(string(data), `{`, `{"new_field":{"nested":[1,"]"]},"Tenant":"x",`, 1)
	in = strings.Replace(in, `"source":{`, `"source":{"leader_epoch":4,`, 1)
	var s Signal
	if err := DecodeSignal([]byte(in), &s); err != nil {
		t.Fatalf("%s: %v", in, err)
	}
	if s.Tenant != "acme" {
		t.Errorf("tenant %q", s.Tenant)
	}
}

func TestSignalValidateRules(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Signal)
		field  string
		want   []string
	}{
		{"id empty", func(s *Signal) { s.ID = "" }, "id", []string{"required"}},
		{"id too long", func(s *Signal) { s.ID = strings.Repeat("a", 129) }, "id", []string{"128"}},
		{"kind empty", func(s *Signal) { s.Kind = "" }, "kind", []string{"required", "tier_crossed"}},
		{"kind unknown", func(s *Signal) { s.Kind = "budget_forecast" }, "kind", []string{"budget_forecast", "skip"}},
		{"time zero", func(s *Signal) { s.Time = time.Time{} }, "time", []string{"required"}},
		{"tenant bad", func(s *Signal) { s.Tenant = "a/b" }, "tenant", []string{"0x2F"}},
		{"model empty", func(s *Signal) { s.Model = "" }, "model", []string{"required"}},
		{"quota unknown", func(s *Signal) { s.Quota = "weekly_tokens" }, "quota", []string{"monthly_tokens"}},
		{"period unknown", func(s *Signal) { s.Period = "week" }, "period", []string{"minute, hour, day, month"}},
		{"period_start missing", func(s *Signal) { s.PeriodStart = time.Time{} }, "period_start", []string{"period_end"}},
		{"period_end missing", func(s *Signal) { s.PeriodEnd = time.Time{} }, "period_end", []string{"period_start"}},
		{"period_end before start", func(s *Signal) { s.PeriodEnd = s.PeriodStart }, "period_end", []string{"after period_start"}},
		{"tier too high", func(s *Signal) { s.Tier = 1001; s.PreviousTier = 0 }, "tier", []string{"1001", "1000", "MaxTier"}},
		{"tier negative", func(s *Signal) { s.Tier = -1; s.Direction = DirectionDown }, "tier", []string{"1000"}},
		{"previous_tier negative", func(s *Signal) { s.PreviousTier = -1 }, "previous_tier", []string{"1000"}},
		{"direction missing", func(s *Signal) { s.Direction = "" }, "direction", []string{"required for tier_crossed"}},
		{"direction unknown", func(s *Signal) { s.Direction = "sideways" }, "direction", []string{"up or down"}},
		{"direction up inconsistent", func(s *Signal) { s.Tier, s.PreviousTier = 70, 90 }, "direction", []string{"not above"}},
		{"direction down inconsistent", func(s *Signal) { s.Direction = DirectionDown }, "direction", []string{"not below"}},
		{"used negative", func(s *Signal) { s.Used = -1 }, "used", []string{"negative"}},
		{"limit NaN", func(s *Signal) { s.Limit = math.NaN() }, "limit", []string{"finite"}},
		{"rate infinite", func(s *Signal) { s.Rate = math.Inf(1) }, "rate", []string{"finite"}},
		{"unit unknown", func(s *Signal) { s.Unit = "dollars" }, "unit", []string{"currency"}},
		{"predicted missing", func(s *Signal) { s.Kind = SignalExhaustionPredicted }, "predicted_exhaustion", []string{"required"}},
		{"predicted zero", func(s *Signal) { s.PredictedExhaustion = new(time.Time) }, "predicted_exhaustion", []string{"required"}},
		{"mode unknown", func(s *Signal) { s.Mode = "strict" }, "mode", []string{"hard or soft"}},
		{"reason too long", func(s *Signal) { s.Reason = strings.Repeat("r", MaxReasonLen+1) }, "reason", []string{"1025", "1024", "MaxReasonLen"}},
		{"partition negative", func(s *Signal) { s.Source.Partition = -1 }, "source.partition", []string{"-1"}},
		{"from_offset negative", func(s *Signal) { s.Source.FromOffset = -1 }, "source.from_offset", []string{"-1"}},
		{"to before from", func(s *Signal) { s.Source.ToOffset = 9 }, "source.to_offset", []string{"9", "10"}},
		{"attribute key", func(s *Signal) { s.Attributes = map[string]string{"a b": ""} }, "attributes.a b", []string{"0x20"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := validSignal()
			tc.mutate(&s)
			err := s.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			schematest.WantFieldError(t, err, tc.field, tc.want...)
			if ve := schematest.FieldErrors(t, err); len(ve) != 1 {
				t.Errorf("want one problem, got %v", err)
			}
			if _, err := EncodeSignal(&s); err == nil {
				t.Error("EncodeSignal accepted an invalid signal")
			}
		})
	}
}

func TestDecodeSignalProblems(t *testing.T) {
	base := `{"id":"s1","kind":"period_reset","time":"2024-05-01T00:00:00Z","tenant":"acme","model":"*"`
	cases := []struct{ in, field string }{
		{base + `,"tier":"90"}`, "tier"},
		{base + `,"tier":90.5}`, "tier"},
		{base + `,"used":"1"}`, "used"},
		{base + `,"used":1e999}`, "used"},
		{base + `,"period_start":"2024-05-01"}`, "period_start"},
		{base + `,"source":[]}`, "source"},
		{base + `,"source":{"partition":3000000000}}`, "source.partition"},
		{base + `,"source":{"to_offset":"1"}}`, "source.to_offset"},
		{base + `,"kind":"anomaly"}`, "kind"},
		{base + `,"attributes":{"a":1}}`, "attributes.a"},
		{`{"kind":"anomaly","time":null,"tenant":"acme","model":"*","id":"x"}`, "time"},
	}
	for _, tc := range cases {
		var s Signal
		err := DecodeSignal([]byte(tc.in), &s)
		if err == nil {
			t.Errorf("accepted %s", tc.in)
			continue
		}
		schematest.WantFieldError(t, err, tc.field)
		if ve := schematest.FieldErrors(t, err); len(ve) != 1 {
			t.Errorf("%s: want one problem, got %v", tc.in, err)
		}
	}
	var s Signal
	var se *SyntaxError
	if err := DecodeSignal([]byte(base), &s); !errors.As(err, &se) {
		t.Errorf("truncated signal: want *SyntaxError, got %v", err)
	}
}

func TestDecodeSignalSyntaxErrors(t *testing.T) {
	base := `{"id":"s1","kind":"period_reset","time":"2024-05-01T00:00:00Z","tenant":"acme","model":"*"}`
	cases := []struct {
		in     string
		offset int64 // -1: any
	}{
		{"", 0}, {"  ", 2}, {" []", 1}, {`"x"`, 0}, {base + "{}", -1}, {base + " x", -1},
		{`{"id":"a",}`, -1}, {`{"id" "a"}`, -1}, {`{"source":{"partition":}}`, -1},
	}
	for _, tc := range cases {
		var s Signal
		var se *SyntaxError
		if err := DecodeSignal([]byte(tc.in), &s); !errors.As(err, &se) {
			t.Errorf("%q: want *SyntaxError, got %v", tc.in, err)
		} else if tc.offset >= 0 && se.Offset != tc.offset {
			t.Errorf("%q: offset %d, want %d (%v)", tc.in, se.Offset, tc.offset, se)
		}
	}
}

func TestDecodeSignalUnknownKindStillDecodes(t *testing.T) {
	in := `{"id":"s1","kind":"budget_forecast","time":"2024-05-01T00:00:00Z","tenant":"acme","model":"*","tier":70}`
	var s Signal
	err := DecodeSignal([]byte(in), &s)
	schematest.WantFieldError(t, err, "kind", "skip")
	if s.Tenant != "acme" || s.Tier != 70 {
		t.Errorf("not decoded: %+v", s)
	}
}

func TestSignalEnumsValid(t *testing.T) {
	for _, k := range []SignalKind{SignalTierCrossed, SignalExhaustionPredicted, SignalQuotaExhausted, SignalPeriodReset,
		SignalRateExceeded, SignalAnomaly, SignalLateEvent, SignalReconciliationDrift} {
		if !k.Valid() {
			t.Errorf("%q", k)
		}
	}
	for _, q := range []QuotaKind{QuotaMonthlyTokens, QuotaDailyTokens, QuotaHourlyTokens, QuotaTokensPerMinute,
		QuotaRequestsPerMinute, QuotaBudget} {
		if !q.Valid() {
			t.Errorf("%q", q)
		}
	}
	for _, p := range []Period{PeriodMinute, PeriodHour, PeriodDay, PeriodMonth} {
		if !p.Valid() {
			t.Errorf("%q", p)
		}
	}
	if !UnitCurrency.Valid() || !ModeSoft.Valid() || !DirectionDown.Valid() || Unit("x").Valid() {
		t.Error("enum Valid")
	}
}
