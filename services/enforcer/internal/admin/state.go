package admin

import (
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

// Record is what an action puts on the admin topic (schemas.TopicAdminV1):
// State is the action now in force for Key, Lifted for a lift (the
// publisher gives it its version; see internal/adminlog).
type Record struct {
	Key   string
	State *schemas.AdminState
}

// RecordsOf returns the admin topic records of a normalized action. An
// action with no record (reset of a signal-driven breaker: quota, rate,
// error_ratio, slow_call) returns none and local is true: it acts on the
// serving replica's table only, because those breakers are not operator
// state (the next signal may open them again anyway). Reset without a kind
// lifts the manual trip of the scope through the topic and resets the rest
// locally.
func RecordsOf(action adminapi.Action, req adminapi.Request, actor string, now time.Time) (recs []Record, local bool) {
	st := &schemas.AdminState{Tenant: req.Tenant, Model: req.Model, APIKeyID: req.APIKeyID, Until: req.ExpiresAt,
		Reason: req.Reason, Actor: actor, Time: now}
	// A lift is a version of the scope too, so that it stands against a
	// replay of what it lifts; it expires at once.
	tomb := func(s *schemas.AdminState) Record {
		l := *s
		l.Lifted, l.Until = true, now
		return Record{Key: s.Key(), State: &l}
	}
	switch action {
	case adminapi.ActionTrip:
		st.Kind = schemas.AdminTrip
		return []Record{{Key: st.Key(), State: st}}, false
	case adminapi.ActionReset:
		st.Kind = schemas.AdminTrip
		switch req.Kind {
		case flags.KindManual:
			return []Record{tomb(st)}, false
		case "":
			return []Record{tomb(st)}, true
		}
		return nil, true
	case adminapi.ActionBlacklist, adminapi.ActionUnblacklist:
		st.Kind, st.Model = schemas.AdminBlacklist, flags.AllModels
		if action == adminapi.ActionUnblacklist {
			return []Record{tomb(st)}, false
		}
		return []Record{{Key: st.Key(), State: st}}, false
	case adminapi.ActionSetOverride, adminapi.ActionClearOverride:
		st.Kind, st.Quota, st.APIKeyID = schemas.AdminOverride, req.Quota, ""
		if req.Limit != nil {
			st.Limit = *req.Limit
		}
		if action == adminapi.ActionClearOverride {
			return []Record{tomb(st)}, false
		}
		return []Record{{Key: st.Key(), State: st}}, false
	}
	return nil, true
}

// ApplyRecord folds one admin topic record into table at now and returns
// the tenant it concerns and whether flags may have changed. key is the
// scope (schemas.AdminState.Key); st is what is now in force for it (nil
// when a tombstone of a record without versions lifted it). A lifted state,
// or one past its Until, lifts the scope's action: a newer version
// replaced any older one of the scope, and an expired action is in force
// nowhere. internal/adminlog decides which records get here, in version
// order per scope.
func ApplyRecord(table *breaker.Table, key string, st *schemas.AdminState, now time.Time) (string, bool) {
	if st != nil && st.Active(now) {
		switch st.Kind {
		case schemas.AdminTrip:
			scope := st.Model
			if st.APIKeyID != "" {
				scope = flags.KeyField(st.APIKeyID)
			}
			table.Trip(st.Tenant, scope, st.Reason, st.Actor, st.Until, st.Time)
		case schemas.AdminBlacklist:
			table.Blacklist(st.Tenant, st.APIKeyID, st.Reason, st.Actor, st.Until, st.Time)
		case schemas.AdminOverride:
			table.SetOverride(breaker.Override{Tenant: st.Tenant, Model: st.Model, Quota: string(st.Quota), Limit: st.Limit,
				Until: st.Until, Reason: st.Reason, Actor: st.Actor}, now)
		}
		return st.Tenant, true
	}
	parts := strings.Split(key, "\x00")
	if len(parts) != 4 {
		return "", false
	}
	tenant, kind, scope, quota := parts[0], schemas.AdminKind(parts[1]), parts[2], parts[3]
	switch kind {
	case schemas.AdminTrip:
		return tenant, table.Reset(tenant, scope, flags.KindManual)
	case schemas.AdminBlacklist:
		apiKeyID := ""
		if k, ok := strings.CutPrefix(scope, flags.KeyFieldPrefix); ok {
			apiKeyID = k
		}
		return tenant, table.Unblacklist(tenant, apiKeyID)
	case schemas.AdminOverride:
		return tenant, table.ClearOverride(tenant, scope, quota)
	}
	return "", false
}
