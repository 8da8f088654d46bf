package schemas

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// TopicAdminV1 is the compacted Kafka topic that holds every operator
// action in force: manual breakers, blacklists and quota overrides, one
// record per scope (see [AdminState.Key]). The enforcer's admin API
// produces to it (acks=all) before it answers, so an action survives any
// replica or restart; every enforcer replica reads the whole topic to
// build its admin state, and the aggregator reads it so that an override
// changes tiers, signals and alerts, not only flags.
//
// Each record carries one version of a scope's action ([AdminState.Version],
// one above the previous version of the scope; a lift is a version too,
// with Lifted set), and its record key is derived from the scope and the
// version under the signing key (signalauth's RecordKey), never the scope
// itself: compaction then cannot be made to drop a signed action by a
// tombstone someone else produced. Readers keep the highest version of
// each scope and refuse an older one (a replay). A nil value (a tombstone)
// only lets compaction drop a superseded version; in records written by a
// release without versions, where the key is [AdminState.Key], it lifts
// that key's action.
const TopicAdminV1 = "sluice.admin.v1"

// SchemaAdminV1 is the [HeaderSchema] value of an admin state record.
const SchemaAdminV1 = TopicAdminV1

// SchemaControlPlaneV1 is the [HeaderSchema] value of a control-plane
// record on [TopicAdminV1] (an API key managed at runtime; see
// internal/controlplane). Readers of operator actions skip such records by
// this header, before verifying them: they are signed in a MAC domain of
// their own, so an operator action's signature never verifies one.
const SchemaControlPlaneV1 = "sluice.controlplane.v1"

// AdminKind is what an operator action does.
type AdminKind string

// The operator actions kept on [TopicAdminV1].
const (
	// AdminTrip is a manual breaker on a tenant, a model or an API key.
	AdminTrip AdminKind = "trip"
	// AdminBlacklist blocks a tenant or one of its API keys.
	AdminBlacklist AdminKind = "blacklist"
	// AdminOverride replaces one quota's limit; Limit 0 blocks at once.
	AdminOverride AdminKind = "override"
)

// Valid reports whether k is a defined kind.
func (k AdminKind) Valid() bool { return k == AdminTrip || k == AdminBlacklist || k == AdminOverride }

// AdminState is one operator action in force. It is the value of a
// [TopicAdminV1] record, JSON-encoded; its key is [AdminState.Key].
type AdminState struct {
	// Kind says what the action does.
	Kind AdminKind `json:"kind"`
	// Tenant is the tenant the action applies to.
	Tenant string `json:"tenant"`
	// Model is the model it applies to, "*" for every model.
	Model string `json:"model"`
	// APIKeyID, when set, narrows a trip or blacklist to one API key.
	APIKeyID string `json:"api_key_id,omitempty"`
	// Quota is the quota an override replaces; empty otherwise.
	Quota QuotaKind `json:"quota,omitempty"`
	// Limit is the override's limit in the quota's unit.
	Limit float64 `json:"limit,omitempty"`
	// Until is when the action lapses by itself; every consumer ignores an
	// action past its Until, whether or not a tombstone followed.
	Until time.Time `json:"until"`
	// Reason is the operator's note, for operators only: never shown to
	// end users.
	Reason string `json:"reason,omitempty"`
	// Actor is who made the change (the admin token's name).
	Actor string `json:"actor,omitempty"`
	// Time is when the action was taken.
	Time time.Time `json:"time"`
	// Version orders the records of one scope (Key): the writer gives each
	// new action or lift of a scope its previous version plus one, and
	// readers refuse a record older than the version they hold, so a
	// genuine record replayed after it was superseded changes nothing. 0 is
	// a record written before versions existed.
	Version uint64 `json:"version,omitempty"`
	// Lifted says the record lifts the scope's action (an unblacklist, a
	// reset of a manual breaker, a cleared override): it is in force
	// nowhere, and its version stands against replays of what it lifted.
	Lifted bool `json:"lifted,omitempty"`
}

// Key is the compaction key of the action: one record per kind and scope,
// so a newer action on the same scope replaces the older one. The tenant
// comes first, so a consumer can tell a record's tenant without decoding.
func (a *AdminState) Key() string {
	scope := a.Model
	if a.APIKeyID != "" {
		scope = "@key:" + a.APIKeyID
	}
	return a.Tenant + "\x00" + string(a.Kind) + "\x00" + scope + "\x00" + string(a.Quota)
}

// VersionKey is the logical key of this version of the action: Key and
// Version, from which its record key is derived.
func (a *AdminState) VersionKey() string {
	return a.Key() + "\x00v" + strconv.FormatUint(a.Version, 10)
}

// AdminKeyTenant returns the tenant of an [AdminState.Key].
func AdminKeyTenant(key string) string {
	t, _, _ := strings.Cut(key, "\x00")
	return t
}

// Active reports whether the action applies at now: not lifted, not
// expired.
func (a *AdminState) Active(now time.Time) bool { return !a.Lifted && now.Before(a.Until) }

// Validate names the field and the rule of each problem.
func (a *AdminState) Validate() error {
	var errs ValidationError
	if !a.Kind.Valid() {
		errs.Add("", "kind", fmt.Sprintf("is %q; use trip, blacklist or override", a.Kind))
	}
	if a.Tenant == "" || len(a.Tenant) > MaxTenantLen {
		errs.Add("", "tenant", fmt.Sprintf("must be 1..%d bytes", MaxTenantLen))
	}
	if a.Model == "" {
		errs.Add("", "model", `is required; use "*" for every model`)
	}
	if a.Kind == AdminOverride {
		if !a.Quota.Valid() {
			errs.Add("", "quota", fmt.Sprintf("is %q; an override names one of the quota kinds", a.Quota))
		}
		if a.Limit < 0 {
			errs.Add("", "limit", "must not be negative")
		}
	}
	if a.Until.IsZero() {
		errs.Add("", "until", "is required: every operator action expires")
	}
	return errs.Err()
}

// EncodeAdminState returns the record value of a.
func EncodeAdminState(a *AdminState) ([]byte, error) { return json.Marshal(a) }

// DecodeAdminState parses and validates a record value.
func DecodeAdminState(data []byte) (*AdminState, error) {
	var a AdminState
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("admin state: %w", err)
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return &a, nil
}
