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
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
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
// Every record is signed (signalauth.AdminActions, the signal_auth key
// ring): a record anyone could produce to the topic would otherwise lift a
// blacklist or a manual breaker, or raise a quota. Unsigned and badly
// signed records — tombstones included — are refused, counted and logged,
// and leave the action of their key as it was; under
// signal_auth.accept_unsigned_state (a migration from a release that did
// not sign) unsigned ones are applied and counted apart.
type adminState struct {
	c     *core
	kc    *kgo.Client
	topic string
	log   *slog.Logger
	auth  *signalauth.Auth
	// refused counts refused records, for the log's rate limit.
	refused atomic.Int64

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
		kgo.ConsumeTopics(cfg.AdminTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	compact := "compact"
	adm := kadm.NewClient(kc)
	resp, err := adm.CreateTopics(ctx, 1, env.Kafka.ReplicationFactor,
		kafkaconn.TopicConfigs(ctx, adm, env.Kafka, map[string]*string{"cleanup.policy": &compact}), cfg.AdminTopic)
	if err == nil {
		for _, r := range resp.Sorted() {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				err = r.Err
			}
		}
	}
	if err != nil {
		kc.Close()
		return nil, fmt.Errorf("services.enforcer.admin_topic: create %s: %w", cfg.AdminTopic, err)
	}
	a := &adminState{c: c, kc: kc, topic: cfg.AdminTopic, log: c.log, auth: c.auth.For(signalauth.AdminActions),
		applied: map[int32]int64{}, wake: make(chan struct{}), target: map[int32]int64{}, caught: make(chan struct{}),
		records: newAdminMetrics(),
		unsigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_enforcer_admin_records_unsigned_total",
			Help: "Unsigned admin records applied under signal_auth.accept_unsigned_state (a migration); re-issue their actions, then turn it off."})}
	ends, err := kafkaconn.EndOffsets(ctx, kadm.NewClient(kc), cfg.AdminTopic)
	if err != nil {
		kc.Close()
		return nil, fmt.Errorf("services.enforcer.admin_topic: end offsets of %s: %w", cfg.AdminTopic, err)
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
		fs.EachRecord(func(r *kgo.Record) {
			if !a.authentic(r) {
				a.advance(r.Partition, r.Offset)
				return
			}
			var st *schemas.AdminState
			if r.Value != nil {
				var err error
				if st, err = schemas.DecodeAdminState(r.Value); err != nil {
					a.records.WithLabelValues("invalid").Inc()
					a.log.Warn("enforcer: skipping an invalid admin record", "key", fmt.Sprintf("%q", r.Key), "offset", r.Offset, "err", err)
				} else if st.Key() != string(r.Key) {
					a.records.WithLabelValues("invalid").Inc()
					a.log.Warn("enforcer: skipping an admin record whose key is not its state's", "key", fmt.Sprintf("%q", r.Key), "offset", r.Offset)
					st = nil
				}
				if st == nil {
					a.advance(r.Partition, r.Offset)
					return
				}
			}
			tenant, changed := admin.ApplyRecord(a.c.table, string(r.Key), st, now)
			if st != nil && st.Active(now) {
				a.records.WithLabelValues("applied").Inc()
			} else {
				a.records.WithLabelValues("lifted").Inc()
			}
			if changed && tenant != "" {
				a.c.writer.MarkDirty(tenant)
			}
			a.advance(r.Partition, r.Offset)
		})
	}
	return nil
}

// authentic reports whether r may be applied (see adminState), and
// counts and logs it when not: the first ten refusals, then every
// thousandth, so a flood of forgeries cannot bury the log.
func (a *adminState) authentic(r *kgo.Record) bool {
	unsigned, err := a.auth.Admit(r)
	if err != nil {
		a.records.WithLabelValues("unauthenticated").Inc()
		if n := a.refused.Add(1); n <= 10 || n%1000 == 0 {
			a.log.Warn("enforcer: refusing an unauthenticated admin record; the action of its key stays as it was",
				"reason", signalauth.Reason(err), "key", fmt.Sprintf("%q", r.Key), "offset", r.Offset, "refused_so_far", n)
		}
		return false
	}
	if unsigned {
		a.unsigned.Inc()
		a.log.Warn("enforcer: applying an unsigned admin record (signal_auth.accept_unsigned_state); re-issue its action through the admin API so that it is signed",
			"key", fmt.Sprintf("%q", r.Key), "offset", r.Offset)
	}
	return true
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

// Publish produces recs signed (acks=all, idempotent: franz-go's defaults) and
// returns once the broker acknowledged them and this replica applied
// them, so the admin API answers with the action in force.
func (a *adminState) Publish(ctx context.Context, recs []admin.Record) error {
	krs := make([]*kgo.Record, 0, len(recs))
	for _, r := range recs {
		var v []byte // nil: a tombstone, which lifts the key's action
		if r.State != nil {
			var err error
			if v, err = schemas.EncodeAdminState(r.State); err != nil {
				return err
			}
		}
		krs = append(krs, a.auth.Record(a.topic, []byte(r.Key), v))
	}
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
		Help: "Records of the admin topic read by this replica, by result (applied, lifted, invalid, unauthenticated: unsigned or badly signed, refused)."}, []string{"result"})
}
