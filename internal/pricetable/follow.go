package pricetable

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/periodic"
)

// RetryInterval is how soon a failed sync is tried again when no reload
// comes first.
const RetryInterval = time.Minute

// Follower keeps the prices table following a policy watcher: at start,
// on every reload, and again every RetryInterval after a failure. It runs
// in every service that always runs with the policy (the aggregator, the
// reconciler), so the SQL cost views price usage from the first event
// instead of reading "(unpriced)" until the nightly reconciler starts.
// Sync only adds rows, so two services following the same policy write
// each entry once or, racing, twice with the same figures, which the
// views collapse.
type Follower struct {
	conn  driver.Conn
	log   *slog.Logger
	syncs *prometheus.CounterVec
	rows  prometheus.Counter
	// pending is the policy whose last sync failed, for RetryFailed; nil
	// when the last sync worked.
	pending atomic.Pointer[policy.Policy]
	// Now is the clock stamped into inserted_at; time.Now by default.
	Now func() time.Time
}

// NewFollower registers the follower's metrics on reg, labelled with the
// service so that two services in one process (`sluice run`) do not clash.
func NewFollower(conn driver.Conn, log *slog.Logger, reg prometheus.Registerer, service string) (*Follower, error) {
	labels := prometheus.Labels{"service": service}
	f := &Follower{conn: conn, log: log, Now: time.Now,
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_price_syncs_total", ConstLabels: labels,
			Help: "Copies of the policy's price list into ClickHouse's prices table, by result (ok, error)."}, []string{"result"}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_price_rows_written_total", ConstLabels: labels,
			Help: "Price entries written to ClickHouse's prices table (new or corrected in the policy)."}),
	}
	for _, c := range []prometheus.Collector{f.syncs, f.rows} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("pricetable: register metrics: %w", err)
		}
	}
	return f, nil
}

// Apply syncs p's prices once, logging and counting the outcome. A failed
// sync is remembered for RetryFailed; a later Apply supersedes it.
func (f *Follower) Apply(ctx context.Context, p *policy.Policy) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := Sync(ctx, f.conn, p.Prices(), f.Now())
	if err != nil {
		f.pending.Store(p)
		f.syncs.WithLabelValues("error").Inc()
		f.log.Error("prices table not updated from the policy; cost reports show new prices as unpriced until a retry succeeds",
			"err", err, "retry_in", RetryInterval)
		return err
	}
	f.pending.CompareAndSwap(p, nil)
	f.syncs.WithLabelValues("ok").Inc()
	f.rows.Add(float64(n))
	if n > 0 {
		f.log.Info("prices table updated from the policy", "rows", n)
	}
	return nil
}

// RetryFailed applies again, every RetryInterval, the policy whose last
// sync failed, until ctx ends. A service runs it in its errgroup next to
// the policy watcher's Follow whose apply calls Apply: the watcher has one
// subscriber, which hands each reload to every part of the service.
func (f *Follower) RetryFailed(ctx context.Context) error {
	periodic.Every(ctx, RetryInterval, func() {
		if p := f.pending.Load(); p != nil {
			_ = f.Apply(ctx, p)
		}
	})
	return nil
}
