package priority

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/schemas"
)

// The classes, short, for the tables below.
const (
	Low      = schemas.PriorityLow
	Normal   = schemas.PriorityNormal
	High     = schemas.PriorityHigh
	Critical = schemas.PriorityCritical
)

func TestEffective(t *testing.T) {
	for _, c := range []struct {
		name   string
		tenant schemas.Priority
		header string
		grant  Grant
		want   schemas.Priority
		err    error
	}{
		{"no header: tenant class", High, "", Grant{}, High, nil},
		{"no header, policy names none: normal", "", "", Grant{}, Normal, nil},
		{"anyone may lower", High, "low", Grant{}, Low, nil},
		{"same class is not a raise", Normal, "normal", Grant{}, Normal, nil},
		{"raise without grant refused", Normal, "high", Grant{}, "", ErrRaiseNotAllowed},
		{"raise within grant", Normal, "high", Grant{Max: High}, High, nil},
		{"raise past grant refused", Normal, "critical", Grant{Max: High}, "", ErrRaiseNotAllowed},
		{"full grant", Low, "critical", Grant{Max: Critical}, Critical, nil},
		{"unknown name refused", Normal, "urgent", Grant{Max: Critical}, "", schemas.ErrUnknownPriority},
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
