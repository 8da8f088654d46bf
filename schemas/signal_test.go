package schemas_test

import (
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/schematest"
)

func validSignal() schemas.Signal {
	start := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	return schemas.Signal{
		ID: schemas.SignalID("tier_crossed", "acme", "*", "monthly_tokens", "2024-05", "90"), Kind: schemas.SignalTierCrossed,
		Time: time.Date(2024, 5, 20, 8, 15, 0, 0, time.UTC), Tenant: "acme", Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth, PeriodStart: start, PeriodEnd: start.AddDate(0, 1, 0),
		Tier: 90, PreviousTier: 70, Direction: schemas.DirectionUp, Used: 9e7, Limit: 1e8, Unit: schemas.UnitTokens,
		Rate: 41000, Mode: schemas.ModeHard, Reason: "90%", Source: schemas.SignalSource{Partition: 3, FromOffset: 10, ToOffset: 12},
	}
}

func TestSignalID(t *testing.T) {
	a := schemas.SignalID("tier_crossed", "acme", "90")
	if a != schemas.SignalID("tier_crossed", "acme", "90") {
		t.Error("not deterministic")
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Errorf("id %q is not 32 hex digits", a)
	}
	if schemas.SignalID("ab", "c") == schemas.SignalID("a", "bc") || schemas.SignalID("a") == schemas.SignalID("a", "") || schemas.SignalID() == schemas.SignalID("") {
		t.Error("part boundaries are ambiguous")
	}
	if schemas.CheckID(a) != "" {
		t.Error("SignalID does not satisfy the id rules")
	}
}

func TestSignalRoundTrip(t *testing.T) {
	s := validSignal()
	pe := time.Date(2024, 5, 28, 0, 0, 0, 0, time.UTC)
	s.PredictedExhaustion = &pe
	s.Attributes = map[string]string{"horizon": "2h"}
	data, err := schemas.EncodeSignal(&s)
	if err != nil {
		t.Fatal(err)
	}
	var back schemas.Signal
	if err := schemas.DecodeSignal(data, &back); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	again, err := schemas.EncodeSignal(&back)
	if err != nil || string(again) != string(data) {
		t.Errorf("round trip changed the signal:\n%s\n%s %v", data, again, err)
	}
	if back.PredictedExhaustion == nil || !back.PredictedExhaustion.Equal(pe) || back.Source != s.Source {
		t.Errorf("decoded %+v", back)
	}
}

func TestDecodeSignalTestdata(t *testing.T) {
	for _, name := range []string{"signal-tier-crossed.json", "signal-exhaustion-predicted.json"} {
		var s schemas.Signal
		if err := schemas.DecodeSignal(schematest.ReadTestdata(t, name), &s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDecodeSignalToleratesUnknownFields(t *testing.T) {
	data, err := schemas.EncodeSignal(new(validSignal()))
	if err != nil {
		t.Fatal(err)
	}
	in := strings.Replace(string(data), `{`, `{"new_field":{"nested":[1,"]"]},"Tenant":"x",`, 1)
	in = strings.Replace(in, `"source":{`, `"source":{"leader_epoch":4,`, 1)
	var s schemas.Signal
	if err := schemas.DecodeSignal([]byte(in), &s); err != nil {
		t.Fatalf("%s: %v", in, err)
	}
	if s.Tenant != "acme" {
		t.Errorf("tenant %q", s.Tenant)
	}
}

func TestSignalValidateRules(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*schemas.Signal)
		field  string
		want   []string
	}{
		{"id empty", func(s *schemas.Signal) { s.ID = "" }, "id", []string{"required"}},
		{"id too long", func(s *schemas.Signal) { s.ID = strings.Repeat("a", 129) }, "id", []string{"128"}},
		{"kind empty", func(s *schemas.Signal) { s.Kind = "" }, "kind", []string{"required", "tier_crossed"}},
		{"kind unknown", func(s *schemas.Signal) { s.Kind = "budget_forecast" }, "kind", []string{"budget_forecast", "skip"}},
		{"time zero", func(s *schemas.Signal) { s.Time = time.Time{} }, "time", []string{"required"}},
		{"tenant bad", func(s *schemas.Signal) { s.Tenant = "a/b" }, "tenant", []string{"0x2F"}},
		{"model empty", func(s *schemas.Signal) { s.Model = "" }, "model", []string{"required"}},
		{"quota unknown", func(s *schemas.Signal) { s.Quota = "weekly_tokens" }, "quota", []string{"monthly_tokens"}},
		{"period unknown", func(s *schemas.Signal) { s.Period = "week" }, "period", []string{"minute, hour, day, month"}},
		{"period_start missing", func(s *schemas.Signal) { s.PeriodStart = time.Time{} }, "period_start", []string{"period_end"}},
		{"period_end missing", func(s *schemas.Signal) { s.PeriodEnd = time.Time{} }, "period_end", []string{"period_start"}},
		{"period_end before start", func(s *schemas.Signal) { s.PeriodEnd = s.PeriodStart }, "period_end", []string{"after period_start"}},
		{"tier too high", func(s *schemas.Signal) { s.Tier = 1001; s.PreviousTier = 0 }, "tier", []string{"1001", "1000", "MaxTier"}},
		{"tier negative", func(s *schemas.Signal) { s.Tier = -1; s.Direction = schemas.DirectionDown }, "tier", []string{"1000"}},
		{"previous_tier negative", func(s *schemas.Signal) { s.PreviousTier = -1 }, "previous_tier", []string{"1000"}},
		{"direction missing", func(s *schemas.Signal) { s.Direction = "" }, "direction", []string{"required for tier_crossed"}},
		{"direction unknown", func(s *schemas.Signal) { s.Direction = "sideways" }, "direction", []string{"up or down"}},
		{"direction up inconsistent", func(s *schemas.Signal) { s.Tier, s.PreviousTier = 70, 90 }, "direction", []string{"not above"}},
		{"direction down inconsistent", func(s *schemas.Signal) { s.Direction = schemas.DirectionDown }, "direction", []string{"not below"}},
		{"used negative", func(s *schemas.Signal) { s.Used = -1 }, "used", []string{"negative"}},
		{"limit NaN", func(s *schemas.Signal) { s.Limit = math.NaN() }, "limit", []string{"finite"}},
		{"rate infinite", func(s *schemas.Signal) { s.Rate = math.Inf(1) }, "rate", []string{"finite"}},
		{"unit unknown", func(s *schemas.Signal) { s.Unit = "dollars" }, "unit", []string{"currency"}},
		{"predicted missing", func(s *schemas.Signal) { s.Kind = schemas.SignalExhaustionPredicted }, "predicted_exhaustion", []string{"required"}},
		{"predicted zero", func(s *schemas.Signal) { s.PredictedExhaustion = new(time.Time) }, "predicted_exhaustion", []string{"required"}},
		{"mode unknown", func(s *schemas.Signal) { s.Mode = "strict" }, "mode", []string{"hard or soft"}},
		{"reason too long", func(s *schemas.Signal) { s.Reason = strings.Repeat("r", schemas.MaxReasonLen+1) }, "reason", []string{"1025", "1024", "MaxReasonLen"}},
		{"partition negative", func(s *schemas.Signal) { s.Source.Partition = -1 }, "source.partition", []string{"-1"}},
		{"from_offset negative", func(s *schemas.Signal) { s.Source.FromOffset = -1 }, "source.from_offset", []string{"-1"}},
		{"to before from", func(s *schemas.Signal) { s.Source.ToOffset = 9 }, "source.to_offset", []string{"9", "10"}},
		{"attribute key", func(s *schemas.Signal) { s.Attributes = map[string]string{"a b": ""} }, "attributes.a b", []string{"0x20"}},
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
			if _, err := schemas.EncodeSignal(&s); err == nil {
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
		var s schemas.Signal
		err := schemas.DecodeSignal([]byte(tc.in), &s)
		if err == nil {
			t.Errorf("accepted %s", tc.in)
			continue
		}
		schematest.WantFieldError(t, err, tc.field)
		if ve := schematest.FieldErrors(t, err); len(ve) != 1 {
			t.Errorf("%s: want one problem, got %v", tc.in, err)
		}
	}
	var s schemas.Signal
	var se *schemas.SyntaxError
	if err := schemas.DecodeSignal([]byte(base), &s); !errors.As(err, &se) {
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
		var s schemas.Signal
		var se *schemas.SyntaxError
		if err := schemas.DecodeSignal([]byte(tc.in), &s); !errors.As(err, &se) {
			t.Errorf("%q: want *SyntaxError, got %v", tc.in, err)
		} else if tc.offset >= 0 && se.Offset != tc.offset {
			t.Errorf("%q: offset %d, want %d (%v)", tc.in, se.Offset, tc.offset, se)
		}
	}
}

func TestDecodeSignalUnknownKindStillDecodes(t *testing.T) {
	in := `{"id":"s1","kind":"budget_forecast","time":"2024-05-01T00:00:00Z","tenant":"acme","model":"*","tier":70}`
	var s schemas.Signal
	err := schemas.DecodeSignal([]byte(in), &s)
	schematest.WantFieldError(t, err, "kind", "skip")
	if s.Tenant != "acme" || s.Tier != 70 {
		t.Errorf("not decoded: %+v", s)
	}
}

func TestSignalEnumsValid(t *testing.T) {
	for _, k := range []schemas.SignalKind{schemas.SignalTierCrossed, schemas.SignalExhaustionPredicted, schemas.SignalQuotaExhausted, schemas.SignalPeriodReset,
		schemas.SignalRateExceeded, schemas.SignalAnomaly, schemas.SignalLateEvent, schemas.SignalReconciliationDrift} {
		if !k.Valid() {
			t.Errorf("%q", k)
		}
	}
	for _, q := range []schemas.QuotaKind{schemas.QuotaMonthlyTokens, schemas.QuotaDailyTokens, schemas.QuotaHourlyTokens, schemas.QuotaTokensPerMinute,
		schemas.QuotaRequestsPerMinute, schemas.QuotaBudget} {
		if !q.Valid() {
			t.Errorf("%q", q)
		}
	}
	for _, p := range []schemas.Period{schemas.PeriodMinute, schemas.PeriodHour, schemas.PeriodDay, schemas.PeriodMonth} {
		if !p.Valid() {
			t.Errorf("%q", p)
		}
	}
	if !schemas.UnitCurrency.Valid() || !schemas.ModeSoft.Valid() || !schemas.DirectionDown.Valid() || schemas.Unit("x").Valid() {
		t.Error("enum Valid")
	}
}
