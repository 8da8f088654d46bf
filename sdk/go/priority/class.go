package priority

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/schemas"
)

// Class is a request's priority class. Greater is more important, so
// comparisons read naturally (c >= High). The zero Class is "not set";
// Effective turns it into the default, Normal.
type Class uint8

// The classes, least important first.
const (
	// Low is batch or background traffic: shed first, served last.
	Low Class = iota + 1
	// Normal is the default class.
	Normal
	// High is interactive traffic.
	High
	// Critical is shed last and served first.
	Critical
)

// NumClasses is the number of classes; Class.Index maps them onto
// 0..NumClasses-1 for arrays indexed by class.
const NumClasses = 4

// Default is the class of a tenant whose policy names none.
const Default = Normal

// Header is the request header through which a caller asks for another
// class than its tenant's (see Effective).
const Header = "X-Sluice-Priority"

var names = [NumClasses + 1]string{"", "low", "normal", "high", "critical"}

// String is the class's name as the policy, the header and usage events
// spell it ("critical", "high", "normal", "low"); "" for the zero Class.
func (c Class) String() string {
	if c > Critical {
		return fmt.Sprintf("class(%d)", uint8(c))
	}
	return names[c]
}

// Valid reports whether c is one of the four classes.
func (c Class) Valid() bool { return c >= Low && c <= Critical }

// Index is c's position in arrays of NumClasses (Low 0 … Critical 3). It
// panics on an invalid class, which would otherwise corrupt a neighbour's
// counters.
func (c Class) Index() int {
	if !c.Valid() {
		panic(fmt.Sprintf("priority: Index of invalid class %d", uint8(c)))
	}
	return int(c) - 1
}

// Schema is c as a usage event carries it; the zero Class is the empty
// Priority ("the tenant's default").
func (c Class) Schema() schemas.Priority {
	if !c.Valid() {
		return ""
	}
	return schemas.Priority(names[c])
}

// FromSchema returns the class of a usage event's priority; the empty
// Priority is the zero Class.
func FromSchema(p schemas.Priority) (Class, error) {
	if p == "" {
		return 0, nil
	}
	return Parse(string(p))
}

// ErrUnknownClass is wrapped by every error about a class name that is
// not one of the four.
var ErrUnknownClass = errors.New("not one of critical, high, normal, low")

// Parse reads a class name, ignoring case and surrounding spaces (a
// header written "High" means high). An empty or unknown name is an
// error wrapping ErrUnknownClass.
func Parse(s string) (Class, error) {
	t := strings.TrimSpace(s)
	for c := Low; c <= Critical; c++ {
		if strings.EqualFold(t, names[c]) {
			return c, nil
		}
	}
	if len(t) > 32 {
		t = t[:32] + "…" // a header can be long; the error quotes only its start
	}
	return 0, fmt.Errorf("priority %q: %w", t, ErrUnknownClass)
}

// MarshalText writes the class's name.
func (c Class) MarshalText() ([]byte, error) {
	if !c.Valid() {
		return nil, fmt.Errorf("priority: cannot marshal invalid class %d", uint8(c))
	}
	return []byte(names[c]), nil
}

// UnmarshalText reads a class name as Parse does.
func (c *Class) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// Grant is what a caller's API key allows its priority header to do. The
// key files say which keys may raise their priority; this package only
// applies the answer.
type Grant struct {
	// Max is the highest class the header may ask for. The zero Grant
	// (Max unset) lets the header lower the class but never raise it.
	Max Class
}

// The errors of Effective. Each is wrapped with the header's value.
var (
	// ErrRaiseNotAllowed: the header asks for a class above both the
	// tenant's and the key's Grant.
	ErrRaiseNotAllowed = errors.New("this API key may not raise its priority that far")
)

// Effective is the class a request runs under:
//
//   - no header (empty value): the tenant's class from its policy (Default
//     when the policy names none);
//   - a header naming a class at or below the tenant's: that class. Any
//     caller may lower its own priority, since only its own requests wait
//     longer for it;
//   - a header naming a class above the tenant's: that class if the key's
//     Grant reaches it, otherwise an error wrapping ErrRaiseNotAllowed. The
//     request is refused rather than silently served at a lower class, so
//     that a misconfigured key shows up at once;
//   - a header that names no class: an error wrapping ErrUnknownClass.
//
// A gateway answers either error with 400 or 403 naming Header; it should
// not fall back to the tenant's class, which would hide the mistake.
func Effective(tenant Class, header string, g Grant) (Class, error) {
	if !tenant.Valid() {
		tenant = Default
	}
	if header == "" {
		return tenant, nil
	}
	asked, err := Parse(header)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", Header, err)
	}
	if asked <= tenant || asked <= g.Max {
		return asked, nil
	}
	limit := max(tenant, g.Max)
	return 0, fmt.Errorf("%s: %q is above %q: %w", Header, asked, limit, ErrRaiseNotAllowed)
}
