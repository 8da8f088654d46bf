package priority

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/schemas"
)

func TestParseAcceptsTheFourNamesInAnyCase(t *testing.T) {
	for in, want := range map[string]Class{"critical": Critical, "High": High, " normal ": Normal, "LOW": Low} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "urgent", "0", "vip"} {
		if _, err := Parse(in); !errors.Is(err, ErrUnknownClass) {
			t.Errorf("Parse(%q) error = %v, want ErrUnknownClass", in, err)
		}
	}
}

func TestClassesOrderAndRoundTrip(t *testing.T) {
	if !(Critical > High && High > Normal && Normal > Low && Low > 0) {
		t.Fatal("classes are not ordered critical > high > normal > low > unset")
	}
	for c := Low; c <= Critical; c++ {
		b, err := c.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Class
		if err := back.UnmarshalText(b); err != nil || back != c {
			t.Errorf("%v round-trips to %v, %v", c, back, err)
		}
		if s := c.Schema(); !s.Valid() {
			t.Errorf("%v.Schema() = %q is not a valid event priority", c, s)
		}
		if back, err := FromSchema(c.Schema()); err != nil || back != c {
			t.Errorf("FromSchema(%q) = %v, %v", c.Schema(), back, err)
		}
	}
	if Class(0).Schema() != "" {
		t.Error("the unset class must be the event's empty priority (tenant default)")
	}
	if c, err := FromSchema(schemas.PriorityLow); err != nil || c != Low {
		t.Errorf("FromSchema(low) = %v, %v", c, err)
	}
}

func TestEffective(t *testing.T) {
	for _, c := range []struct {
		name   string
		tenant Class
		header string
		grant  Grant
		want   Class
		err    error
	}{
		{"no header: tenant class", High, "", Grant{}, High, nil},
		{"no header, policy names none: normal", 0, "", Grant{}, Normal, nil},
		{"anyone may lower", High, "low", Grant{}, Low, nil},
		{"same class is not a raise", Normal, "normal", Grant{}, Normal, nil},
		{"raise without grant refused", Normal, "high", Grant{}, 0, ErrRaiseNotAllowed},
		{"raise within grant", Normal, "high", Grant{Max: High}, High, nil},
		{"raise past grant refused", Normal, "critical", Grant{Max: High}, 0, ErrRaiseNotAllowed},
		{"full grant", Low, "critical", Grant{Max: Critical}, Critical, nil},
		{"unknown name refused", Normal, "urgent", Grant{Max: Critical}, 0, ErrUnknownClass},
	} {
		got, err := Effective(c.tenant, c.header, c.grant)
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: Effective(%v, %q, %+v) = %v, %v; want %v, %v", c.name, c.tenant, c.header, c.grant, got, err, c.want, c.err)
		}
	}
}

func TestEffectiveErrorNamesTheHeader(t *testing.T) {
	_, err := Effective(Normal, "critical", Grant{})
	if err == nil || err.Error() != `X-Sluice-Priority: "critical" is above "normal": this API key may not raise its priority that far` {
		t.Fatalf("error = %v", err)
	}
}
