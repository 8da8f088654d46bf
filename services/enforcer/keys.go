package enforcer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/policy"
)

// applyKey folds a control-plane record (an API key, a tenant, a plan)
// into the replica's log, and reports whether it changed a tenant or plan
// (the policy's overlay); the gateways follow the same records themselves.
func (a *adminState) applyKey(r *kgo.Record) (sections bool) {
	res := a.keys.Apply(r)
	a.records.WithLabelValues("key_" + string(res.Outcome)).Inc()
	switch res.Outcome {
	case controlplane.Applied:
		if k := res.Record.Key; k != nil {
			a.keyChanged(k, time.Now())
		}
		return res.Record.HasSections()
	case controlplane.Stale, controlplane.Unauthenticated, controlplane.Invalid:
		if n := a.refused.Add(1); n <= 10 || n%1000 == 0 {
			a.log.Warn("enforcer: refusing a control-plane record; its key stays as it was", "result", res.Outcome,
				"err", res.Err, "offset", r.Offset, "refused_so_far", n)
		}
	}
	return false
}

// keyChanged blacklists a revoked or expired key in the flags, for good,
// and keeps a key with an expiry ahead in expiring until expireKeys
// blacklists it: the gateways that follow the admin topic refuse such a
// key by its record, and every other reader of the flags — the Go and
// Python SDKs' Checkers, the LiteLLM hook, forward-auth — refuses it
// within a flag write, as it does a key an operator blacklisted. Every
// replica applies the same record, so whichever leads writes the flag; a
// restart replays it from the topic.
func (a *adminState) keyChanged(k *controlplane.Key, now time.Time) {
	a.expiring.forget(k.ID)
	switch {
	case k.Revoked:
		at := k.RevokedAt
		if at.IsZero() {
			at = now
		}
		a.blacklistKey(k, "revoked", k.UpdatedBy, at)
	case k.ExpiresAt.IsZero():
	case !now.Before(k.ExpiresAt):
		a.blacklistKey(k, "expired", "expiry", k.ExpiresAt)
	default:
		a.expiring.add(k)
	}
}

func (a *adminState) blacklistKey(k *controlplane.Key, why, by string, at time.Time) {
	a.c.table.Blacklist(k.Tenant, k.ID, "API key "+k.ID+" "+why, by, time.Time{}, at)
	a.c.writer.MarkDirty(k.Tenant)
}

// expireDue blacklists each key of expiring whose expiry is not after
// now; the enforcer's clock calls it (core.expireKeys).
func (a *adminState) expireDue(now time.Time) {
	for _, k := range a.expiring.due(now) {
		a.blacklistKey(k, "expired", "expiry", k.ExpiresAt)
	}
}

// keyExpiries is the keys whose expiry is ahead, by id: the topic's
// reader adds and forgets them, expireKeys takes those that are due.
type keyExpiries struct {
	mu   sync.Mutex
	keys map[string]*controlplane.Key
}

func (e *keyExpiries) add(k *controlplane.Key) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.keys == nil {
		e.keys = map[string]*controlplane.Key{}
	}
	e.keys[k.ID] = k
}

func (e *keyExpiries) forget(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.keys, id)
}

// due removes and returns the keys whose expiry is not after now.
func (e *keyExpiries) due(now time.Time) []*controlplane.Key {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*controlplane.Key
	for id, k := range e.keys {
		if !now.Before(k.ExpiresAt) {
			out = append(out, k)
			delete(e.keys, id)
		}
	}
	return out
}

// Key returns key id as this replica holds it, or nil.
func (a *adminState) Key(id string) *controlplane.Key { return a.keys.Key(id) }

// Keys returns the keys of tenant ("" every tenant).
func (a *adminState) Keys(tenant string) []*controlplane.Key { return a.keys.Keys(tenant) }

// Synced returns once the records present at start are applied.
func (a *adminState) Synced(ctx context.Context) error {
	select {
	case <-a.caughtUp():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PutKey writes k as the version after read (0: a new key) and returns
// once the broker acknowledged it and this replica applied it; see put.
func (a *adminState) PutKey(ctx context.Context, k *controlplane.Key, read uint64, request string) error {
	return a.put(ctx, &controlplane.Record{Kind: controlplane.KindKey, Key: k, Request: request}, read)
}

// Section returns the tenant or plan name as this replica holds it, or nil.
func (a *adminState) Section(kind controlplane.Kind, name string) *controlplane.Section {
	return a.keys.Section(kind, name)
}

// Sections returns the tenants or plans in force.
func (a *adminState) Sections(kind controlplane.Kind) []*controlplane.Section {
	return a.keys.Sections(kind)
}

// PutSection writes s as the version after read (0: none yet) of a
// tenant or plan; see put.
func (a *adminState) PutSection(ctx context.Context, kind controlplane.Kind, s *controlplane.Section, read uint64, request string) error {
	return a.put(ctx, &controlplane.Record{Kind: kind, Section: s, Request: request}, read)
}

// CheckOverlay returns why the policy file with o laid over it would not
// validate, or nil.
func (a *adminState) CheckOverlay(o policy.Overlay) error { return a.c.policy.Check(o) }

// Overlay returns the tenants and plans in force on this replica.
func (a *adminState) Overlay() policy.Overlay { return a.keys.Overlay() }

// put writes rec as the version after read and returns once the broker
// acknowledged it and this replica applied it. It refuses with
// controlplane.ErrStale a change that read an older version than the one
// in force — on this replica after reading the topic to its end, or on
// the topic, when another replica wrote the same version first (the losing
// record is then tombstoned).
func (a *adminState) put(ctx context.Context, rec *controlplane.Record, read uint64) error {
	a.pubMu.Lock()
	defer a.pubMu.Unlock()
	if err := a.catchUpNow(ctx); err != nil {
		return fmt.Errorf("reading %s before writing to it: %w", a.topic, err)
	}
	if cur := a.keys.Version(rec.ID()); cur != read {
		return fmt.Errorf("%w: %s is at version %d, the change read version %d", controlplane.ErrStale, rec.ID(), cur, read)
	}
	rec.SetVersion(read + 1)
	krs, err := a.keys.Records(a.topic, rec)
	if err != nil {
		return err
	}
	if err := a.produceApplied(ctx, krs); err != nil {
		return err
	}
	if !a.keys.InForce(rec.ID(), krs[0].Key) {
		// Another replica's change of the same version came first: ours
		// is refused by every reader; the tombstone lets compaction drop it.
		_ = a.kc.ProduceSync(ctx, a.keys.Tombstone(a.topic, krs[0].Key)).FirstErr()
		return fmt.Errorf("%w: another change of %s was written at the same time", controlplane.ErrStale, rec.ID())
	}
	return nil
}
