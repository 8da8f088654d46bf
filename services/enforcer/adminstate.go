package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/adminlog"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
)

// adminState is the enforcer's share of the operator actions: it reads the
// whole compacted admin topic (schemas.TopicAdminV1) from the start, with
// no consumer group, into the breaker table, and publishes the admin API's
// actions to it. Every replica therefore holds every manual breaker,
// blacklist and override whichever replica served the call, and gets them
// back from Kafka after a restart without ClickHouse; admin_audit stays
// the audit trail.
//
// internal/adminlog decides what a record does: records are signed
// (signalauth.AdminActions) and unsigned or badly signed ones, tombstones
// included, are refused, counted and logged, leaving their scope's action
// as it was (under signal_auth.accept_unsigned_state, a migration,
// unsigned ones are applied and counted apart); each carries its scope's
// version and an older version than the one in force is refused as a
// replay; record keys are derived under the signing key, so a forged
// tombstone cannot make compaction drop an action.
type adminState struct {
	c     *core
	kc    *kgo.Client
	topic string
	log   *slog.Logger
	auth  *signalauth.Auth
	// actions decides what each record does (internal/adminlog).
	actions *adminlog.Log
	// keys holds the control-plane records (API keys) the topic carries
	// beside the operator actions (internal/controlplane).
	keys *controlplane.Log
	// expiring holds the keys in force with an expiry still ahead, by id,
	// for expireKeys (keys.go).
	expiring keyExpiries
	// refused counts refused records, for the log's rate limit.
	refused atomic.Int64
	// pubMu serializes Publish, so that this replica never gives one
	// version of a scope twice.
	pubMu sync.Mutex

	mu      sync.Mutex
	applied map[int32]int64 // next offset to apply, by partition
	wake    chan struct{}   // closed and replaced whenever applied moves
	// target is the topic's end offsets when the replica started; caught
	// is closed once applied reaches them. A replica takes the lead only
	// after that (lease.go): before, its table may lack a blacklist, and
	// its first full rewrite would delete it.
	target map[int32]int64
	caught chan struct{}

	records  *prometheus.CounterVec
	unsigned prometheus.Counter
}

// adminCheck is the readiness check that holds until the admin topic's
// records present at start are applied.
const adminCheck = "enforcer-admin-state"

// openAdminState returns the admin state reader and publisher of cfg's
// admin topic, creating the topic (compacted, one partition: the actions
// are few and one partition keeps them in one order) if the cluster lacks it.
func openAdminState(ctx context.Context, cfg Config, env platform.Env, c *core) (*adminState, error) {
	kc, err := kafkaconn.NewClient(env.Kafka,
		kgo.ConsumeTopics(env.Topics.Admin),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	if err := kafkaconn.EnsureCompactedTopic(ctx, kc, env.Kafka, env.Topics.Admin); err != nil {
		kc.Close()
		return nil, fmt.Errorf("topics.admin: %w", err)
	}
	auth := c.auth.For(signalauth.AdminActions)
	a := &adminState{c: c, kc: kc, topic: env.Topics.Admin, log: c.log, auth: auth, actions: adminlog.New(auth), keys: controlplane.NewLog(c.auth),
		applied: map[int32]int64{}, wake: make(chan struct{}), target: map[int32]int64{}, caught: make(chan struct{}),
		records: newAdminMetrics(),
		unsigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_enforcer_admin_records_unsigned_total",
			Help: "Unsigned admin records applied under signal_auth.accept_unsigned_state (a migration); re-issue their actions, then turn it off."})}
	ends, err := kafkaconn.EndOffsets(ctx, kadm.NewClient(kc), env.Topics.Admin)
	if err != nil {
		kc.Close()
		return nil, fmt.Errorf("topics.admin: end offsets of %s: %w", env.Topics.Admin, err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			a.target[o.Partition] = o.Offset
		}
	})
	a.checkCaughtUp()
	return a, nil
}

// checkCaughtUp closes caught when every partition reached its target;
// the caller holds mu or is the constructor.
func (a *adminState) checkCaughtUp() {
	select {
	case <-a.caught:
		return
	default:
	}
	for p, end := range a.target {
		if a.applied[p] < end {
			return
		}
	}
	close(a.caught)
}

// caughtUp is closed once the records present at start are applied.
func (a *adminState) caughtUp() <-chan struct{} { return a.caught }

// run applies the topic's records until ctx ends. An invalid record is
// logged and skipped: one bad producer must not stop the others' actions.
func (a *adminState) run(ctx context.Context) error {
	for ctx.Err() == nil {
		fs := a.kc.PollFetches(ctx)
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				a.log.Warn("enforcer: admin topic fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		now := time.Now()
		sections := false
		fs.EachRecord(func(r *kgo.Record) {
			sections = a.apply(r, now) || sections
			a.advance(r.Partition, r.Offset)
		})
		if sections {
			// Once per poll, not per record: a replica reading thousands
			// of tenants at start parses the policy once per batch.
			a.c.policy.SetOverlay(a.keys.Overlay())
		}
	}
	return nil
}

// apply folds one record into the breaker table (see adminState), or a
// control-plane record into the keys, tenants and plans; it reports
// whether a tenant or plan changed.
func (a *adminState) apply(r *kgo.Record, now time.Time) bool {
	if controlplane.IsRecord(r) {
		return a.applyKey(r)
	}
	res := a.actions.Apply(r)
	switch res.Outcome {
	case adminlog.Unauthenticated, adminlog.Replayed, adminlog.Invalid:
		a.records.WithLabelValues(string(res.Outcome)).Inc()
		// The first ten, then every thousandth: a flood of forgeries or
		// replays must not bury the log.
		if n := a.refused.Add(1); n <= 10 || n%1000 == 0 {
			a.log.Warn("enforcer: refusing an admin record; the action of its scope stays as it was", "result", res.Outcome,
				"reason", reason(res), "scope", fmt.Sprintf("%q", res.Scope), "offset", r.Offset, "refused_so_far", n)
		}
		return false
	case adminlog.Ignored:
		return false
	}
	if res.Unsigned {
		a.unsigned.Inc()
		a.log.Warn("enforcer: applying an unsigned admin record (signal_auth.accept_unsigned_state); re-issue its action through the admin API so that it is signed",
			"scope", fmt.Sprintf("%q", res.Scope), "offset", r.Offset)
	}
	tenant, changed := admin.ApplyRecord(a.c.table, res.Scope, res.State, now)
	if res.State != nil && res.State.Active(now) {
		a.records.WithLabelValues("applied").Inc()
	} else {
		a.records.WithLabelValues("lifted").Inc()
	}
	if changed && tenant != "" {
		a.c.writer.MarkDirty(tenant)
	}
	return false
}

// reason labels why adminlog refused a record, for the log.
func reason(res adminlog.Result) string {
	if res.Outcome == adminlog.Unauthenticated {
		return signalauth.Reason(res.Err)
	}
	if res.Err != nil {
		return res.Err.Error()
	}
	return string(res.Outcome)
}

func (a *adminState) advance(p int32, off int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if off+1 > a.applied[p] {
		a.applied[p] = off + 1
	}
	a.checkCaughtUp()
	close(a.wake)
	a.wake = make(chan struct{})
}

// Publish produces recs signed, each as the next version of its scope
// (acks=all, idempotent: franz-go's defaults), and returns once the broker
// acknowledged them and this replica applied them, so the admin API
// answers with the action in force. It first applies the topic up to its
// current end, so that its versions follow those other replicas wrote.
func (a *adminState) Publish(ctx context.Context, recs []admin.Record) error {
	a.pubMu.Lock()
	defer a.pubMu.Unlock()
	if err := a.catchUpNow(ctx); err != nil {
		return fmt.Errorf("reading %s before writing to it: %w", a.topic, err)
	}
	var krs []*kgo.Record
	want := map[string]uint64{}
	for _, r := range recs {
		if r.State == nil {
			return fmt.Errorf("admin record %q: no state (a lift is a state with lifted set)", r.Key)
		}
		rs, err := a.actions.Records(a.topic, r.State)
		if err != nil {
			return err
		}
		krs = append(krs, rs...)
		want[r.State.Key()] = r.State.Version
	}
	if err := a.produceApplied(ctx, krs); err != nil {
		return err
	}
	for scope, v := range want {
		if got := a.actions.Version(scope); got != v {
			return fmt.Errorf("admin action on %q: another replica wrote version %d of its scope at the same time as this version %d; list the scope and retry", scope, got, v)
		}
	}
	return nil
}

// produceApplied produces krs and returns once the broker acknowledged
// them and this replica applied them, so that a change is answered in
// force.
func (a *adminState) produceApplied(ctx context.Context, krs []*kgo.Record) error {
	res := a.kc.ProduceSync(ctx, krs...)
	if err := res.FirstErr(); err != nil {
		return fmt.Errorf("produce to %s: %w", a.topic, err)
	}
	for _, r := range res {
		if err := a.waitApplied(ctx, r.Record.Partition, r.Record.Offset); err != nil {
			return fmt.Errorf("acknowledged by the broker but not yet applied here: %w", err)
		}
	}
	return nil
}

// catchUpNow waits until this replica applied every record the topic holds
// now.
func (a *adminState) catchUpNow(ctx context.Context) error {
	ends, err := kafkaconn.EndOffsets(ctx, kadm.NewClient(a.kc), a.topic)
	if err != nil {
		return err
	}
	var werr error
	ends.Each(func(o kadm.ListedOffset) {
		if werr == nil && o.Err == nil && o.Offset > 0 {
			werr = a.waitApplied(ctx, o.Partition, o.Offset-1)
		}
	})
	return werr
}

func (a *adminState) waitApplied(ctx context.Context, p int32, off int64) error {
	for {
		a.mu.Lock()
		done, wake := a.applied[p] > off, a.wake
		a.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
}

func (a *adminState) close() { a.kc.Close() }

// newAdminMetrics is the counter of admin topic records.
func newAdminMetrics() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_enforcer_admin_records_total",
		Help: "Records of the admin topic read by this replica, by result (applied, lifted, invalid, unauthenticated: unsigned or badly signed, refused; replayed: a version older than its scope's, refused; key_applied, key_stale, key_invalid, key_unauthenticated, key_ignored: the control plane's API key records, docs/controlplane.md)."}, []string{"result"})
}
