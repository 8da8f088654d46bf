package admission

import (
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Request is what admission needs to know about one call before it is made.
type Request struct {
	// ID names the request in logs (the usage event's id, say); it need
	// not be unique. Settlement does not rest on it: its markers in Redis
	// carry an id Admit makes for each admission (random per Limiter, then
	// a sequence number), so an id a client chose, reused by a tenant or
	// shared by tenants or gateways, cannot make one request's settlement
	// pass for another's.
	ID       string
	Tenant   string
	Model    string
	User     string
	Key      string // API key id
	Endpoint string
	// Session is the agent session or conversation the call belongs to,
	// and Organization the tenant's organisation, for rules scoped by
	// them; empty when the caller has none.
	Session      string
	Organization string
	// Upstream is the provider account (or deployment) the call goes to;
	// empty means the model.
	Upstream string
	// Priority decides whether a rule's reserve (Rule.Reserve) is open to
	// the request: high and critical requests may use it, the others not;
	// empty is normal.
	Priority schemas.Priority
	// PromptTokens and CompletionTokens are the estimates debited now and
	// corrected by Ticket.Settle.
	PromptTokens     int64
	CompletionTokens int64
	// Cost is the call's estimated cost in Cost units (millionths of the
	// price table's currency), debited from the rules that count Cost
	// and corrected by Ticket.Settle: a caller that prices calls sets it
	// from the same estimate as the tokens, at the model's price (sluice
	// gateway: the prompt's estimate and max_tokens), so that a call
	// whose worst case would cross a money limit is refused before it is
	// made. Zero debits the least amount, 1.
	Cost int64
	// Deadline is the caller's own deadline (zero: none): Acquire never
	// holds the request past it, nor past ctx's.
	Deadline time.Time
}

func (r *Request) upstream() string {
	if r.Upstream != "" {
		return r.Upstream
	}
	return r.Model
}

func (r *Request) estimate() amounts {
	return amounts{prompt: r.PromptTokens, completion: r.CompletionTokens, cost: r.Cost}
}

// Usage is what a call really spent: its tokens and, for the rules that
// count Cost, its cost in Cost units.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64
}

// actual returns the units a call that spent u counts against unit.
func (u Usage) actual(unit Unit) int64 {
	if unit == Requests {
		return 1
	}
	return amounts{prompt: u.PromptTokens, completion: u.CompletionTokens, cost: u.Cost}.of(unit)
}

// amounts is what one call counts, estimated or spent, in each unit but
// requests.
type amounts struct{ prompt, completion, cost int64 }

func (a amounts) of(u Unit) int64 {
	switch u {
	case PromptTokens:
		return a.prompt
	case CompletionTokens:
		return a.completion
	case Cost:
		return a.cost
	}
	return a.prompt + a.completion
}

// Path says how a decision was reached.
type Path uint8

// The paths.
const (
	// PathNone: no rule applies to the request.
	PathNone Path = iota
	// PathLease: every rule was decided from this gateway's leases, with
	// no network call.
	PathLease
	// PathRedis: at least one rule was decided by Redis in this call.
	PathRedis
	// PathCached: refused from memory because Redis refused the same rule
	// instance moments ago (see WithRefusalCache).
	PathCached
	// PathLocal: Redis was unreachable and the tenant fails open; the local
	// limiter decided.
	PathLocal
	// PathUnavailable: Redis was unreachable and the tenant fails closed.
	PathUnavailable
)

var pathNames = [...]string{"none", "lease", "redis", "cached", "local", "unavailable"}

func (p Path) String() string {
	if int(p) < len(pathNames) {
		return pathNames[p]
	}
	return "unknown"
}

// Headroom is what one rule has left, for the rate-limit headers.
type Headroom struct {
	// Limit is the rule's limit (a bucket's burst); 0 means no rule of this
	// kind applied.
	Limit     int64
	Remaining int64
	// Reset is the time until the rule is back to its full limit.
	Reset time.Duration
}

// Decision is the outcome of Admit.
type Decision struct {
	Allowed bool
	Path    Path
	// Rule names the refusing rule (empty when Allowed, and when the tenant
	// fails closed because Redis is unreachable). Scope holds the values of
	// the refusing instance.
	Rule      string
	Scope     Scope
	Unit      Unit
	Algorithm Algorithm
	// Limit, Window and Rate are the refusing rule's.
	Limit  int64
	Window time.Duration
	Rate   float64
	// Requested is what the request asked of the rule, Available what the
	// rule had for it.
	Requested int64
	Available int64
	// RetryAfter is when the request would fit; 0 with Never false means
	// unknown.
	RetryAfter time.Duration
	// Never is set when the request can never fit the rule (it asks more
	// than the limit).
	Never bool
	// Cause is why Redis could not decide (PathLocal, PathUnavailable).
	Cause error
	// Requests and Tokens describe the tightest request-counting and
	// token-counting rules that applied, for the x-ratelimit-* headers.
	Requests Headroom
	Tokens   Headroom
}
