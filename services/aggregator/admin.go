package aggregator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/adminlog"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Operator overrides (sluice.admin.v1).
//
// The enforcer's admin API writes every operator action to the compacted
// admin topic; the aggregator reads it so that a quota override changes
// tiers, quota_state, signals and alerts, not only the enforcer's flags
// (otherwise an override lifts the flag while the alert keeps firing
// until the period ends). At start the aggregator reads the topic to its
// end before it joins the usage consumer group, so no event is evaluated
// without the overrides in force; then it follows the topic. Each record
// replaces the action of its key; a tombstone lifts it. Overrides reach
// every partition's state, which re-evaluates the tenant at once, and so
// does an override's expiry (checked every second against this host's
// clock, and at every usage record). Trips and blacklists are the
// enforcer's alone: they are flags, not quotas.
//
// Records are read as the enforcer reads them (internal/adminlog): signed
// by the enforcer (signalauth.AdminActions, the signal_auth key ring) and
// verified here, since a forged override could raise a tenant's quota past
// what the policy allows, or a forged lift drop one that stops a leaked
// key's spend; versioned per scope, since a replayed genuine override
// would raise it again after it was lifted. Unsigned and badly signed
// records, tombstones included, are refused and counted
// (sluice_aggregator_admin_unauthenticated_total), and so are versions
// older than their scope's (sluice_aggregator_admin_replayed_total); each
// leaves its scope's action as it was. signal_auth.accept_unsigned_state
// admits unsigned ones during a migration.

// adminFollower holds the admin topic's current records.
type adminFollower struct {
	cl      *kgo.Client
	actions *adminlog.Log
	// cp holds the control-plane records; sections is set when a tenant
	// or plan among them changed since the policy's overlay was last set.
	cp       *controlplane.Log
	sections bool
	// refused counts refused records, for the log's rate limit.
	refused int64
}

// newAdminFollower creates the admin topic if it is missing (compacted:
// one record per key is its whole meaning) and a client reading it from
// its start, outside any group: every aggregator instance needs all of it.
func newAdminFollower(ctx context.Context, kc kafkaconn.Config, topic string, auth *signalauth.Auth) (*adminFollower, error) {
	cl, err := kafkaconn.NewClient(kc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	if err := kafkaconn.EnsureCompactedTopic(ctx, cl, kc, topic); err != nil {
		cl.Close()
		return nil, fmt.Errorf("admin topic: %w", err)
	}
	return &adminFollower{cl: cl, actions: adminlog.New(auth.For(signalauth.AdminActions)), cp: controlplane.NewLog(auth)}, nil
}

// adminRecord folds one admin record into the follower's state and returns
// the tenant whose overrides it changed ("" when it changed none). Called
// with a.mu held once the consumer runs.
func (a *aggregator) adminRecord(r *kgo.Record) string {
	f := a.admin
	if controlplane.IsRecord(r) {
		// Refused ones are the enforcer's and gateways' to count and log.
		if res := f.cp.Apply(r); res.Outcome == controlplane.Applied && res.Record.HasSections() {
			f.sections = true
		}
		return ""
	}
	res := f.actions.Apply(r)
	switch res.Outcome {
	case adminlog.Unauthenticated, adminlog.Replayed, adminlog.Invalid:
		reason := string(res.Outcome)
		switch res.Outcome {
		case adminlog.Unauthenticated:
			a.m.adminRefused.Inc()
			reason = signalauth.Reason(res.Err)
		case adminlog.Replayed:
			a.m.adminReplayed.Inc()
		default:
			a.m.adminInvalid.Inc()
		}
		// The first ten, then every thousandth: forgeries must not bury the log.
		if f.refused++; f.refused <= 10 || f.refused%1000 == 0 {
			a.log.Warn("refusing an admin record; the action of its scope stays as it was", "result", res.Outcome, "reason", reason,
				"err", res.Err, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "refused_so_far", f.refused)
		}
		return ""
	case adminlog.Ignored:
		return ""
	}
	if res.Unsigned {
		a.m.adminUnsigned.Inc()
		a.log.Warn("applying an unsigned admin record (signal_auth.accept_unsigned_state); re-issue its action through the admin API so that it is signed",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
	}
	isOverride := func(st *schemas.AdminState) bool { return st != nil && st.Kind == schemas.AdminOverride }
	if !isOverride(res.State) && !isOverride(res.Previous) {
		return ""
	}
	return schemas.AdminKeyTenant(res.Scope)
}

// overridesOf returns tenant's overrides in force at now, in scope order.
func (a *aggregator) overridesOf(tenant string, now time.Time) []tally.Override {
	var in []*schemas.AdminState
	a.admin.actions.Each(func(st *schemas.AdminState) {
		if st.Kind == schemas.AdminOverride && st.Tenant == tenant && st.Active(now) {
			in = append(in, st)
		}
	})
	sort.Slice(in, func(i, j int) bool { return in[i].Key() < in[j].Key() })
	out := make([]tally.Override, 0, len(in))
	for _, st := range in {
		out = append(out, tally.Override{Model: st.Model, Quota: st.Quota, Limit: st.Limit, Until: st.Until})
	}
	return out
}

// installOverrides gives a new partition state every override in force.
// Called with a.mu held (or before the consumer starts).
func (a *aggregator) installOverrides(st *tally.Partition, now time.Time) {
	tenants := map[string]bool{}
	a.admin.actions.Each(func(s *schemas.AdminState) {
		if s.Kind == schemas.AdminOverride {
			tenants[s.Tenant] = true
		}
	})
	for tn := range tenants {
		st.SetOverrides(tn, a.overridesOf(tn, now))
	}
}

// overridesChanged applies the overrides of tenants to every partition
// at once and has the next flush publish what changed. Called with a.mu
// held.
func (a *aggregator) overridesChanged(tenants []string) {
	if len(tenants) == 0 {
		return
	}
	now := time.Now()
	for _, tn := range tenants {
		ovs := a.overridesOf(tn, now)
		for _, p := range a.parts {
			p.settle()
			p.state.SetOverrides(tn, ovs)
		}
		a.log.Info("operator overrides applied to tiers", "tenant", tn, "overrides", len(ovs))
	}
	a.m.reevaluations.Inc()
	a.markPending()
}

// markPending starts the flush clock when a state has signals or rows
// without new events. Called with a.mu held.
func (a *aggregator) markPending() {
	for _, p := range a.parts {
		if p.state.Pending() && a.since.IsZero() {
			a.since = time.Now()
		}
	}
}

// followSections lays the admin API's tenants and plans over the policy
// file when they changed. SetOverlay only publishes: the partitions get the
// policy from Watcher.Follow, as a reload of the file, so a.mu may be held.
func (a *aggregator) followSections() {
	if a.admin.sections {
		a.admin.sections = false
		a.watcher.SetOverlay(a.admin.cp.Overlay())
	}
}

// followAdmin follows the admin topic until ctx ends and, every tick,
// moves each partition's reference clock to now so that overrides expire
// on time even for a tenant that sends nothing.
func (a *aggregator) followAdmin(ctx context.Context, tick time.Duration) error {
	next := time.Now().Add(tick)
	for ctx.Err() == nil {
		pctx, cancel := context.WithDeadline(ctx, next)
		fs := a.admin.cl.PollFetches(pctx)
		cancel()
		if fs.IsClientClosed() {
			return nil
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				a.log.Warn("admin topic fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		// a.mu guards the admin states too: a partition assigned meanwhile
		// installs them (onAssigned runs under a.mu).
		a.mu.Lock()
		var tenants []string
		fs.EachRecord(func(r *kgo.Record) {
			if tn := a.adminRecord(r); tn != "" && !slices.Contains(tenants, tn) {
				tenants = append(tenants, tn)
			}
		})
		a.overridesChanged(tenants)
		a.followSections()
		if now := time.Now(); !now.Before(next) {
			next = now.Add(tick)
			for _, p := range a.parts {
				if p.snap == nil { // a frozen state moves at the next tick
					p.state.SetClock(now)
				}
			}
			a.markPending()
		}
		a.mu.Unlock()
	}
	return nil
}
