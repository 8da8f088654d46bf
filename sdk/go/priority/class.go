package priority

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/schemas"
)

// A request's class is a schemas.Priority: the one type usage events, the
// policy, admission and this package share. Arrays indexed by class have
// schemas.NumPriorities entries (Priority.Index); classes compare by
// Priority.Rank.

// Header is the request header through which a caller asks for another
// class than its tenant's (see Effective).
const Header = "X-Sluice-Priority"

// Grant is what a caller's API key allows its priority header to do. The
// key files say which keys may raise their priority; this package only
// applies the answer.
type Grant struct {
	// Max is the highest class the header may ask for. The zero Grant
	// (Max unset) lets the header lower the class but never raise it.
	Max schemas.Priority
}

// The errors of Effective. Each is wrapped with the header's value.
var (
	// ErrRaiseNotAllowed: the header asks for a class above both the
	// tenant's and the key's Grant.
	ErrRaiseNotAllowed = errors.New("this API key may not raise its priority that far")
)

// Effective is the class a request runs under:
//
//   - no header (empty value): the tenant's class from its policy
//     (schemas.PriorityNormal when the policy names none);
//   - a header naming a class at or below the tenant's: that class. Any
//     caller may lower its own priority, since only its own requests wait
//     longer for it;
//   - a header naming a class above the tenant's: that class if the key's
//     Grant reaches it, otherwise an error wrapping ErrRaiseNotAllowed. The
//     request is refused rather than silently served at a lower class, so
//     that a misconfigured key shows up at once;
//   - a header that names no class: an error wrapping
//     schemas.ErrUnknownPriority.
//
// A gateway answers either error with 400 or 403 naming Header; it should
// not fall back to the tenant's class, which would hide the mistake.
func Effective(tenant schemas.Priority, header string, g Grant) (schemas.Priority, error) {
	tenant = tenant.OrDefault()
	if header == "" {
		return tenant, nil
	}
	asked, err := schemas.ParsePriority(header)
	if err != nil {
		return "", fmt.Errorf("%s: %w", Header, err)
	}
	if asked.Rank() <= tenant.Rank() || asked.Rank() <= g.Max.Rank() {
		return asked, nil
	}
	limit := tenant
	if g.Max.Rank() > limit.Rank() {
		limit = g.Max
	}
	return "", fmt.Errorf("%s: %q is above %q: %w", Header, asked, limit, ErrRaiseNotAllowed)
}
