// Package flags is the Redis layout of enforcement flags: the one contract
// the enforcer (which writes flags) and the gateway Checker (which reads
// them) share. It names the keys, encodes and decodes a flag value,
// describes the pub/sub announcements, and lists the tenant keys of a Redis
// or of every master of a Redis Cluster (ScanTenants).
//
// Layout (every key of one tenant carries the hash tag {tenant}, so a tenant
// stays on one Redis Cluster slot):
//
// The names below use DefaultPrefix; Layout puts them under another.
//
//	sluice:flags:{tenant}      hash; field = model, "*" (every model) or
//	                           "@key:<api key id>"; value = Encode(flag);
//	                           field "@v" = the tenant's version.
//	                           The key has a PEXPIRE (flag_ttl) the enforcer
//	                           renews while it lives; each value has its own
//	                           Until (the breaker's own end, not capped) that
//	                           readers enforce, because Redis 7.0 has no
//	                           per-field TTL.
//	sluice:flags:version       string; the version of the latest write batch.
//	                           Versions strictly increase across tenants (the
//	                           enforcer's clock in unix µs, bumped as needed).
//	sluice:flags:changes       pub/sub channel; message "<tenant> <version>",
//	                           "@heartbeat <unix ms>" from a live enforcer,
//	                           "@failmode <version>" when fail modes changed.
//	sluice:flags:heartbeat     string, unix ms of the enforcer's last beat,
//	                           with a short PEXPIRE.
//	sluice:flags:failmode      hash tenant -> "open"|"closed" (field "*" is
//	                           the default); no expiry, so a Checker knows
//	                           each tenant's fail mode after the enforcer died.
//	sluice:flags:ttl           string, the enforcer's flag_ttl in ms; no
//	                           expiry: a reader with a stale view drops
//	                           traffic-tied flags flag_ttl after the
//	                           enforcer's last sign of life.
//
// Model names beginning with "@" are reserved by this layout.
//
// docs/flags.md describes the layout, the value format and the reading rules
// for gateways written in other languages.
package flags

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix starts every key name; a deployment (or a test) sharing a
// Redis with another one picks its own prefix through Layout.
const DefaultPrefix = "sluice:flags:"

// Field names and message parts; see the package documentation.
const (
	// VersionField is the hash field holding the tenant's version.
	VersionField = "@v"
	// KeyFieldPrefix starts the field of a flag on one API key.
	KeyFieldPrefix = "@key:"
	// AllModels is the field of a tenant-wide flag.
	AllModels = "*"
	// HeartbeatTenant is the tenant part of a heartbeat announcement.
	HeartbeatTenant = "@heartbeat"
	// FailModeTenant is the tenant part of the announcement that the
	// fail-mode hash changed.
	FailModeTenant = "@failmode"
)

// ProbeAttribute is the usage-event attribute that marks the settlement
// of a request a half-open flag let through as a probe (checker.Probe);
// its value is the flag's kind. The aggregator judges a half-open
// breaker by these probes' outcomes — one failed probe reopens it, the
// policy's half_open_probes successful ones close it — because a few
// gateways' probes never fill the min_requests window the breaker opened
// on. A gateway that emits its own events must set it on probes
// (docs/flags.md, "Reporting probes").
const ProbeAttribute = "breaker_probe"

// Layout names the keys under one prefix (DefaultPrefix unless a deployment
// shares its Redis).
type Layout struct{ Prefix string }

// Default is the layout under DefaultPrefix.
var Default = Layout{Prefix: DefaultPrefix}

// TenantKey returns the hash key of tenant's flags.
func (l Layout) TenantKey(tenant string) string { return l.Prefix + "{" + tenant + "}" }

// TenantPattern is the SCAN pattern matching every tenant key.
func (l Layout) TenantPattern() string { return l.Prefix + "{*" }

// VersionKey is the global version counter.
func (l Layout) VersionKey() string { return l.Prefix + "version" }

// Channel is the pub/sub channel of change announcements.
func (l Layout) Channel() string { return l.Prefix + "changes" }

// HeartbeatKey is set by a live enforcer.
func (l Layout) HeartbeatKey() string { return l.Prefix + "heartbeat" }

// FailModeKey is the hash of tenant fail modes.
func (l Layout) FailModeKey() string { return l.Prefix + "failmode" }

// TTLKey holds the enforcer's flag_ttl in milliseconds: how long after
// the enforcer's last sign of life a reader keeps its traffic-tied flags
// (docs/flags.md, "Heartbeat and staleness"). It has no expiry, so a
// reader knows it after the enforcer died.
func (l Layout) TTLKey() string { return l.Prefix + "ttl" }

// DefaultFlagTTL is the enforcer's default flag_ttl: what a reader assumes
// before it read TTLKey (or when no enforcer wrote it, as before it
// existed).
const DefaultFlagTTL = time.Minute

// ParseTTL reads the value of TTLKey; it refuses anything that is not a
// whole number of milliseconds within the enforcer's flag_ttl bounds
// (3 s to 24 h), so a stray value never makes flags lapse at once or
// never.
func ParseTTL(v string) (time.Duration, error) {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("flag ttl %q: not a whole number of milliseconds", v)
	}
	d := time.Duration(ms) * time.Millisecond
	if d < 3*time.Second || d > 24*time.Hour {
		return 0, fmt.Errorf("flag ttl %v: outside 3s..24h", d)
	}
	return d, nil
}

// TenantFromKey is the inverse of TenantKey.
func (l Layout) TenantFromKey(key string) (string, bool) {
	s, ok := strings.CutPrefix(key, l.Prefix+"{")
	if !ok || !strings.HasSuffix(s, "}") {
		return "", false
	}
	return s[:len(s)-1], true
}

// KeyField returns the hash field of a flag on API key id.
func KeyField(apiKeyID string) string { return KeyFieldPrefix + apiKeyID }

// State is what a flag tells a gateway to do.
type State string

// The flag states.
const (
	// StateOpen: a breaker is open; refuse the request.
	StateOpen State = "open"
	// StateHalfOpen: a breaker is probing; each Checker lets Probes requests
	// through and refuses the rest.
	StateHalfOpen State = "half_open"
	// StateBlacklist: the tenant or key is blacklisted; refuse.
	StateBlacklist State = "blacklist"
	// StateThrottle: a rate window is exceeded; refuse until it moves on.
	StateThrottle State = "throttle"
	// StateSoft: a soft quota is exceeded. Not a refusal: the request
	// goes through (the overage is billed), but a gateway with cheaper
	// fallback models for the one asked serves it with one of them.
	StateSoft State = "soft"
)

// Kind is the breaker that raised a flag.
type Kind string

// The breaker kinds.
const (
	KindQuota      Kind = "quota"
	KindRate       Kind = "rate"
	KindErrorRatio Kind = "error_ratio"
	KindSlowCall   Kind = "slow_call"
	KindManual     Kind = "manual"
	KindBlacklist  Kind = "blacklist"
)

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool {
	switch k {
	case KindQuota, KindRate, KindErrorRatio, KindSlowCall, KindManual, KindBlacklist:
		return true
	}
	return false
}

// Flag is one enforcement decision for a tenant × model (or API key). It is
// immutable once built: Checkers share it between goroutines.
type Flag struct {
	State State
	Kind  Kind
	// Quota names the limit that was hit (monthly_tokens, requests_per_minute,
	// budget …); empty for breakers not tied to a quota.
	Quota string
	// Period is the quota's period (month, day, hour, minute).
	Period string
	// Until is when the flag stops applying, whatever Redis says.
	Until time.Time
	// RetryAfter is what to tell a client when Until is far away or zero.
	RetryAfter time.Duration
	// Limit and Used are the quota's numbers when known.
	Limit, Used float64
	// ResetsAt is when the quota's period ends; zero when not a quota.
	ResetsAt time.Time
	// Probes is how many requests a Checker lets through while half-open.
	Probes int
	// Reason is the operator's internal note; it may contain any character.
	// Gateways log it and never show it to end users (see docs/flags.md).
	Reason string
}

// Active reports whether f applies at now.
func (f *Flag) Active(now time.Time) bool { return f.Until.IsZero() || now.Before(f.Until) }

// formatVersion is the first element of every encoded value, so a reader can
// tell a value it does not understand.
const formatVersion = "1"

// Encode returns f's compact value:
// 1;state;kind;quota;period;until_ms;retry_ms;limit;used;resets_ms;probes;reason
// Reason goes last so that it may contain the separator.
func Encode(f *Flag) string {
	var b strings.Builder
	b.Grow(64 + len(f.Reason))
	b.WriteString(formatVersion)
	for _, s := range []string{string(f.State), string(f.Kind), f.Quota, f.Period} {
		b.WriteByte(';')
		b.WriteString(s)
	}
	b.WriteByte(';')
	b.WriteString(ms(f.Until))
	b.WriteByte(';')
	b.WriteString(strconv.FormatInt(f.RetryAfter.Milliseconds(), 10))
	b.WriteByte(';')
	b.WriteString(strconv.FormatFloat(f.Limit, 'g', -1, 64))
	b.WriteByte(';')
	b.WriteString(strconv.FormatFloat(f.Used, 'g', -1, 64))
	b.WriteByte(';')
	b.WriteString(ms(f.ResetsAt))
	b.WriteByte(';')
	b.WriteString(strconv.Itoa(f.Probes))
	b.WriteByte(';')
	b.WriteString(f.Reason)
	return b.String()
}

func ms(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

func fromMS(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("%q is not a non-negative integer of milliseconds", s)
	}
	if n == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(n), nil
}

// Decode parses a value written by Encode. Errors name the element.
func Decode(v string) (*Flag, error) {
	p := strings.SplitN(v, ";", 12)
	if len(p) != 12 {
		return nil, fmt.Errorf("flag value has %d elements, want 12", len(p))
	}
	if p[0] != formatVersion {
		return nil, fmt.Errorf("flag value format %q is not %q", p[0], formatVersion)
	}
	f := &Flag{State: State(p[1]), Kind: Kind(p[2]), Quota: p[3], Period: p[4], Reason: p[11]}
	var errs []error
	switch f.State {
	case StateOpen, StateHalfOpen, StateBlacklist, StateThrottle, StateSoft:
	default:
		errs = append(errs, fmt.Errorf("state: %q is not open, half_open, blacklist, throttle or soft", p[1]))
	}
	if !f.Kind.Valid() {
		errs = append(errs, fmt.Errorf("kind: %q is unknown", p[2]))
	}
	var err error
	if f.Until, err = fromMS(p[5]); err != nil {
		errs = append(errs, fmt.Errorf("until: %w", err))
	}
	if n, err := strconv.ParseInt(p[6], 10, 64); err != nil || n < 0 {
		errs = append(errs, fmt.Errorf("retry_after: %q is not a non-negative integer", p[6]))
	} else {
		f.RetryAfter = time.Duration(n) * time.Millisecond
	}
	if f.Limit, err = strconv.ParseFloat(p[7], 64); err != nil {
		errs = append(errs, fmt.Errorf("limit: %q is not a number", p[7]))
	}
	if f.Used, err = strconv.ParseFloat(p[8], 64); err != nil {
		errs = append(errs, fmt.Errorf("used: %q is not a number", p[8]))
	}
	if f.ResetsAt, err = fromMS(p[9]); err != nil {
		errs = append(errs, fmt.Errorf("resets_at: %w", err))
	}
	if f.Probes, err = strconv.Atoi(p[10]); err != nil || f.Probes < 0 {
		errs = append(errs, fmt.Errorf("probes: %q is not a non-negative integer", p[10]))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

// FormatChange returns the pub/sub message announcing tenant's version.
func FormatChange(tenant string, version int64) string {
	return tenant + " " + strconv.FormatInt(version, 10)
}

// ParseChange parses a message of Channel.
func ParseChange(msg string) (tenant string, version int64, err error) {
	t, v, ok := strings.Cut(msg, " ")
	if !ok || t == "" {
		return "", 0, fmt.Errorf("change message %q is not \"<tenant> <version>\"", msg)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("change message %q: version is not an integer", msg)
	}
	return t, n, nil
}
