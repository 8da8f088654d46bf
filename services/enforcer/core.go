package enforcer

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/fifo"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
	"github.com/sluicehq/sluice/services/enforcer/internal/flagwriter"
)

// core is the enforcer without its transports: signals in, flags out. It
// owns the breaker table and the flag writer; where signals come from
// (Kafka, see consume.go), how its memory is rebuilt (ClickHouse, see
// recovery.go) and how it is wired into a process (enforcer.go) are kept
// apart, so that tests drive it with handle and a real Redis alone.
type core struct {
	cfg Config
	// signalsTopic is where signals come from (topics.signals): the
	// topic whose offsets the core commits.
	signalsTopic string
	log          *slog.Logger
	table        *breaker.Table
	writer       *flagwriter.Writer
	policy       *policy.Watcher
	// redisPing checks the flags' Redis for sluice_redis_up (nil: no
	// Redis, no series).
	redisPing func(context.Context) error
	// auth verifies each signal record before it is applied; nil refuses
	// them all (signalauth.Auth.Verify), so an unwired core fails closed.
	auth         *signalauth.Auth
	unauthenticN atomic.Int64 // refused records, for log sampling
	// expireKeys, when set, blacklists the API keys whose expiry came
	// (keys.go); the clock calls it with every tick.
	expireKeys func(now time.Time)
	// tracer is nil when tracing is off; on, a signal whose record
	// carries a trace context is applied in a span of that trace.
	tracer trace.Tracer

	dedupMu sync.Mutex
	seen    *fifo.Set[string] // recent signal ids; guarded by dedupMu

	signals  *prometheus.CounterVec
	restored prometheus.Counter
	leader   prometheus.Gauge
	// offsets tracks the signal offsets handled and durable in Redis, for
	// commits (commit.go); leaseHolder is the lease value last seen (a
	// string), which names the leader whose commits a follower follows.
	offsets     *signalOffsets
	leaseHolder atomic.Value

	// lag observes, for each signal that changed a flag, the wall time
	// from the usage event that caused it to the change: the part of the
	// enforcement lag before the flag write (flush_interval adds the rest).
	lag prometheus.Histogram
}

// newCore returns a core writing flags through rdb under the policy of pw.
// The policy's fail modes are handed to the writer here, before it runs, so
// that its first full rewrite already carries them: a Checker must never
// see a fresh heartbeat next to missing fail modes.
func newCore(cfg Config, rdb redis.UniversalClient, pw *policy.Watcher, log *slog.Logger) *core {
	c := &core{cfg: cfg, log: log, table: breaker.NewTable(), policy: pw, seen: fifo.NewSet[string](cfg.DedupSignals),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_enforcer_signals_total",
			Help: "Signals consumed by the enforcer, by result."}, []string{"result"}),
		restored: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_enforcer_breakers_restored_from_redis_total",
			Help: "Breakers taken back from the flags in Redis when the enforcer started or took the lead (the floor of its state)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_enforcer_leader",
			Help: "1 while this replica holds the leader lease and writes the flags."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_enforcer_signal_lag_seconds",
			Help:    "Enforcement lag: from the time of the usage event a signal was computed from (the gateway's clock) to the enforcer changing a flag for it (the flag write follows within flush_interval). Signals that changed no flag are not observed.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)})}
	if rdb != nil {
		c.redisPing = redisconn.Ready(rdb)
	}
	c.offsets = newSignalOffsets()
	c.writer = flagwriter.New(rdb, c.table, flagwriter.Config{KeyPrefix: cfg.KeyPrefix, FlushInterval: cfg.FlushInterval,
		FlagTTL: cfg.FlagTTL, HeartbeatEvery: cfg.HeartbeatEvery, MaxDirty: cfg.MaxDirty, BatchTenants: cfg.BatchTenants,
		OnFlush: c.offsets.onFlush}, log)
	c.publishFailModes(pw.Current())
	return c
}

// runWriter first takes the flags already in Redis as the floor of the
// table (restoreFloor), then writes flags until ctx ends, and makes a last
// write within cfg.ShutdownTimeout so that changes accepted before shutdown
// reach Redis. Nothing — not a flag, not the heartbeat — is written before
// the floor is in the table: the writer's first act is a full rewrite from
// the table, and a table without what Redis holds would delete every
// blacklist and breaker an earlier enforcer left in force.
func (c *core) runWriter(ctx context.Context) error {
	return c.runWriterAfterFloor(ctx, nil)
}

// runWriterAfterFloor is runWriter that closes floored once the floor is
// in the table: the admin topic is applied only after it, so that its
// lifts apply to what Redis held.
func (c *core) runWriterAfterFloor(ctx context.Context, floored chan<- struct{}) error {
	if !c.restoreFloor(ctx) {
		return nil
	}
	if floored != nil {
		close(floored)
	}
	return c.writer.Run(ctx, c.cfg.ShutdownTimeout)
}

// restore merges stored flags into the table (breaker.Table.Restore).
// With adminOwned, manual and blacklist flags are left out: once this
// replica has read the admin topic, that topic, not Redis, says which are
// in force, and a lift the previous leader died before writing must not be
// undone.
func (c *core) restore(stored []flagwriter.Stored, adminOwned bool) {
	now := time.Now()
	n := 0
	for _, st := range stored {
		written := st.Written
		if written.IsZero() {
			written = now
		}
		for field, f := range st.Flags {
			if adminOwned && (f.Kind == flags.KindManual || f.Kind == flags.KindBlacklist) {
				continue
			}
			if c.table.Restore(st.Tenant, field, f, written, now) {
				n++
			}
		}
	}
	c.restored.Add(float64(n))
	c.log.Info("enforcer: flags in redis merged into the state", "tenants", len(stored), "breakers", n)
}

// restoreFloor reads the flags in Redis into the table, retrying with
// back-off (1 s to 30 s) while Redis is unreachable; it reports false when
// ctx ended first. While it retries nothing is written, and Checkers, seeing
// no heartbeat, apply each tenant's fail mode: the honest answer when the
// enforcer cannot see Redis.
func (c *core) restoreFloor(ctx context.Context) bool {
	for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		stored, err := c.writer.ReadStored(rctx)
		cancel()
		if err == nil {
			c.restore(stored, false)
			return true
		}
		c.log.Warn("enforcer: reading the flags in redis failed; writing nothing until it succeeds", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
	}
}

// runClock ticks every cfg.TickEvery until ctx ends: time, not signals,
// closes quota breakers at period ends, half-opens health breakers and
// expires manual ones.
func (c *core) runClock(ctx context.Context) error {
	t := time.NewTicker(c.cfg.TickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			c.tick(now)
		}
	}
}

// duplicate reports whether id was consumed recently; replayed signals
// (a restarted consumer, a rebalance) must not re-trigger their breakers.
func (c *core) duplicate(id string) bool {
	c.dedupMu.Lock()
	defer c.dedupMu.Unlock()
	return c.seen.Seen(id)
}

// handle folds one decoded signal in; flags are written by the next
// flush. It returns what became of the signal (the result label of
// sluice_enforcer_signals_total).
func (c *core) handle(s *schemas.Signal, now time.Time) string {
	if c.duplicate(s.ID) {
		c.signals.WithLabelValues("duplicate").Inc()
		return "duplicate"
	}
	res := c.table.Apply(s, c.policy.Current().Tenant(s.Tenant), now)
	result := "no_change"
	switch {
	case res.Stale:
		result = "stale"
		c.log.Debug("enforcer: stale signal ignored", "kind", s.Kind, "tenant", s.Tenant, "model", s.Model, "time", s.Time, "period_end", s.PeriodEnd)
	case res.SoftOverage:
		result = "soft_overage"
		c.log.Info("soft quota overage recorded", "tenant", s.Tenant, "model", s.Model, "quota", s.Quota, "used", s.Used, "limit", s.Limit)
	case len(res.Changed) > 0:
		result = "changed"
		c.lag.Observe(max(0, now.Sub(s.Time).Seconds()))
		c.writer.MarkDirty(res.Changed...)
	}
	c.signals.WithLabelValues(result).Inc()
	return result
}

// handleSignalRecord applies one record of the signals topic if its
// signature verifies (signalauth). Anyone who can produce to the topic
// could otherwise lift a quota breaker with a forged period_reset, so a
// record that is unsigned or badly signed is refused, counted
// (result="unauthenticated") and logged — the first ten and then every
// thousandth, so a flood of them cannot bury the log.
func (c *core) handleSignalRecord(r *kgo.Record, now time.Time) {
	if err := c.auth.Verify(r); err != nil {
		c.signals.WithLabelValues("unauthenticated").Inc()
		if n := c.unauthenticN.Add(1); n <= 10 || n%1000 == 0 {
			c.log.Warn("enforcer: refusing an unauthenticated signal", "reason", signalauth.Reason(err),
				"partition", r.Partition, "offset", r.Offset, "refused_so_far", n)
		}
		return
	}
	if c.tracer != nil {
		if ctx := traceprop.RecordContext(context.Background(), r); trace.SpanContextFromContext(ctx).IsValid() {
			c.handleTraced(ctx, r, now)
			return
		}
	}
	c.handleRecord(r.Value, now)
}

// handleTraced applies r in a span that is a child of the trace context
// its record carries (the aggregator's span for the event that raised
// the signal): the flag it changes is written by the next flush.
func (c *core) handleTraced(ctx context.Context, r *kgo.Record, now time.Time) {
	_, span := c.tracer.Start(ctx, "enforcer apply signal", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.Int64("messaging.kafka.offset", r.Offset), attribute.Int("messaging.destination.partition.id", int(r.Partition))))
	defer span.End()
	var s schemas.Signal
	if schemas.DecodeSignal(r.Value, &s) != nil {
		span.SetAttributes(attribute.String("sluice.result", c.handleRecord(r.Value, now))) // counts and logs it
		return
	}
	span.SetAttributes(attribute.String(traceprop.AttrTenant, s.Tenant), attribute.String("sluice.signal.kind", string(s.Kind)),
		attribute.String("sluice.signal.id", s.ID), attribute.String("sluice.signal.quota", string(s.Quota)))
	span.SetAttributes(attribute.String("sluice.result", c.handle(&s, now)))
}

// handleRecord decodes one record's value; bad records are logged and
// skipped, never fatal: one malformed producer must not stop enforcement.
// It returns what became of the signal.
func (c *core) handleRecord(value []byte, now time.Time) string {
	var s schemas.Signal
	if err := schemas.DecodeSignal(value, &s); err != nil {
		c.signals.WithLabelValues("invalid").Inc()
		c.log.Warn("enforcer: skipping undecodable signal", "err", err)
		return "invalid"
	}
	return c.handle(&s, now)
}

func (c *core) tick(now time.Time) {
	p := c.policy.Current()
	if changed := c.table.Tick(now, p.Tenant); len(changed) > 0 {
		c.writer.MarkDirty(changed...)
	}
	if c.expireKeys != nil {
		c.expireKeys(now)
	}
}

// publishFailModes hands p's fail modes to the writer, which writes them
// with its next flush; it is what a policy reload applies.
func (c *core) publishFailModes(p *policy.Policy) {
	m := map[string]string{"*": string(p.Tenant("").FailMode)}
	for _, id := range p.TenantIDs() {
		m[id] = string(p.Tenant(id).FailMode)
	}
	c.writer.SetFailModes(m)
}
