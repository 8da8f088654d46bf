// Package controlplane holds the records Sluice manages at runtime through
// the enforcer's admin API rather than in files — API keys first; tenants,
// plans and quotas are meant to follow as further record kinds of the same
// envelope (Record) — and how they live on the signed, compacted admin
// topic (schemas.TopicAdminV1): Log folds the topic's records into the
// state every reader shares, Follower keeps a Log current from Kafka.
//
// Every record is versioned: the writer gives each change the version it
// read plus one and refuses a change that read an older version (Stale),
// so two operators cannot overwrite each other; readers keep the first
// record of each version in topic order and refuse older or equal ones, so
// a replayed record changes nothing. See docs/controlplane.md.
package controlplane

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/schemas"
)

// Key is one API key managed through the admin API. The secret is never
// stored: it is shown once, when the key is issued or rotated, and only its
// SHA-256 is kept, as in the keys file (internal/keyfile). The rest is what
// the admin API shows of a key (adminapi.KeyTerms).
type Key struct {
	adminapi.KeyTerms
	// SHA256 is the hex SHA-256 of the current secret.
	SHA256 string `json:"sha256"`
	// PreviousSHA256 is the secret a rotation replaced, still accepted
	// until PreviousUntil so that callers can switch without an outage.
	PreviousSHA256 string `json:"previous_sha256,omitempty"`
}

// Limits of a Key, enforced by Validate; the admin API names them in its
// errors.
const (
	MaxIDLen         = 64
	MaxNameLen       = 128
	MaxModels        = 64
	MaxEndpoints     = 16
	MaxEndpointLen   = 256
	MaxKeyLifetime   = 3 * 366 * 24 * time.Hour
	MaxRotateOverlap = 7 * 24 * time.Hour
)

var (
	idRE     = regexp.MustCompile(`^[A-Za-z0-9._-]{1,` + strconv.Itoa(MaxIDLen) + `}$`)
	tenantRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,` + strconv.Itoa(schemas.MaxTenantLen) + `}$`)
)

// ValidTenant reports whether t is a tenant name the admin API accepts:
// 1..schemas.MaxTenantLen characters of [A-Za-z0-9._:-].
func ValidTenant(t string) bool { return tenantRE.MatchString(t) }

// Validate names every bad field and its limit.
func (k *Key) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !idRE.MatchString(k.ID) {
		bad("id: %q must be 1..%d characters of [A-Za-z0-9._-]", k.ID, MaxIDLen)
	}
	if !ValidTenant(k.Tenant) {
		bad("tenant: %q must be 1..%d characters of [A-Za-z0-9._:-]", k.Tenant, schemas.MaxTenantLen)
	}
	if len(k.Name) > MaxNameLen {
		bad("name: %d bytes; the limit is %d", len(k.Name), MaxNameLen)
	}
	for _, h := range []struct{ field, v string }{{"sha256", k.SHA256}, {"previous_sha256", k.PreviousSHA256}} {
		if raw, err := hex.DecodeString(h.v); (h.v != "" || h.field == "sha256") && (err != nil || len(raw) != sha256.Size) {
			bad("%s: must be 64 hex digits", h.field)
		}
	}
	errs = append(errs, checkModels(k.Models)...)
	if len(k.Endpoints) > MaxEndpoints {
		bad("endpoints: %d entries; the limit is %d", len(k.Endpoints), MaxEndpoints)
	}
	for i, e := range k.Endpoints {
		_, err := path.Match(e, "/")
		if err != nil || !strings.HasPrefix(e, "/") || len(e) > MaxEndpointLen || strings.ContainsAny(e, " \t\n?#") {
			bad("endpoints[%d]: %q must be a URL path (or path.Match pattern) such as /v1/chat/completions, at most %d bytes", i, e, MaxEndpointLen)
		}
	}
	return errors.Join(errs...)
}

func checkModels(models []string) []error {
	switch {
	case len(models) == 0:
		return []error{errors.New(`models: required; list the models the key may call (e.g. ["gpt-4o", "gpt-4o-mini*"]) or ["*"] for every model`)}
	case len(models) > MaxModels:
		return []error{fmt.Errorf("models: %d entries; the limit is %d", len(models), MaxModels)}
	case slices.Contains(models, "*") && len(models) > 1:
		return []error{errors.New(`models: "*" (every model) must be the only entry`)}
	}
	var errs []error
	for i, m := range models {
		if _, err := path.Match(m, ""); m == "" || err != nil || len(m) > schemas.MaxModelLen {
			errs = append(errs, fmt.Errorf("models[%d]: %q is not a model name or pattern of at most %d bytes", i, m, schemas.MaxModelLen))
		}
	}
	return errs
}

// ValidAt reports whether a secret whose hash is sha (hex) authenticates k
// at now: neither revoked nor expired, and the current secret or the
// previous one within its overlap.
func (k *Key) ValidAt(sha string, now time.Time) bool {
	if k.Revoked || (!k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt)) {
		return false
	}
	return strings.EqualFold(sha, k.SHA256) || (k.PreviousSHA256 != "" && strings.EqualFold(sha, k.PreviousSHA256) && now.Before(k.PreviousUntil))
}

// secretBytes is the entropy of an issued secret: 256 bits, so that its
// unsalted SHA-256 cannot be searched.
const secretBytes = 32

// SecretPrefix begins every secret the admin API issues, so that a leaked
// one is recognised by secret scanners.
const SecretPrefix = "sk-sluice-"

// NewSecret returns a fresh secret and its hex SHA-256.
func NewSecret() (secret, sha string, err error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("controlplane: no randomness for a secret: %w", err)
	}
	secret = SecretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return secret, HashSecret(secret), nil
}

// HashSecret returns the hex SHA-256 of secret, the form Key.SHA256 holds.
func HashSecret(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// NewID returns a key id for a key issued without one.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "key-" + hex.EncodeToString(b[:])
}

// Fingerprint is what the API and the audit trail show of a hash: enough
// to tell two secrets apart, nothing to search for.
func Fingerprint(sha string) string {
	if len(sha) < 12 {
		return sha
	}
	return "sha256:" + sha[:12]
}

// Diff returns the fields that differ between before and after (nil before:
// every field of after), as the audit trail records them: JSON field names,
// values as JSON, hashes as fingerprints. Comparing the JSON forms keeps
// the diff right for any field a record gains later.
func Diff(before, after any) []adminapi.Change {
	fields := func(v any) map[string]json.RawMessage {
		m := map[string]json.RawMessage{}
		if v == nil {
			return m
		}
		raw, _ := json.Marshal(v)
		_ = json.Unmarshal(raw, &m)
		return m
	}
	b, a := fields(before), fields(after)
	names := map[string]bool{}
	for n := range b {
		names[n] = true
	}
	for n := range a {
		names[n] = true
	}
	var out []adminapi.Change
	for n := range names {
		if n == "version" || string(b[n]) == string(a[n]) {
			continue
		}
		out = append(out, adminapi.Change{Field: n, From: shown(n, b[n]), To: shown(n, a[n])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

func shown(field string, v json.RawMessage) string {
	if len(v) == 0 {
		return ""
	}
	if strings.HasSuffix(field, "sha256") {
		var s string
		_ = json.Unmarshal(v, &s)
		return Fingerprint(s)
	}
	return string(v)
}

// API returns k as the admin API shows it (no hashes, their fingerprints).
func (k *Key) API() adminapi.Key {
	out := adminapi.Key{KeyTerms: k.KeyTerms, Fingerprint: Fingerprint(k.SHA256)}
	if k.PreviousSHA256 != "" {
		out.PreviousFingerprint = Fingerprint(k.PreviousSHA256)
	} else {
		out.PreviousUntil = time.Time{}
	}
	return out
}
