// Package aggregator is the Sluice service that turns sluice.usage.v1 into
// what enforcement, alerts and billing read: per tenant × model and tenant ×
// all models it keeps sliding rates, hour/day/month totals in the tenant's
// time zone, cost, usage against every quota of the policy, alert tiers and
// exhaustion predictions; it writes raw events, minute rollups and quota
// state to ClickHouse and publishes signals to sluice.signals.v1.
//
// # Exactly-once effect
//
// The consumer group uses cooperative-sticky balancing and manual commits.
// State is partition-local: every tenant is counted on its home partition,
// murmur2(tenant) mod partitions, where ingest's key partitioner puts it; a
// record found elsewhere (a direct producer with another partitioner) is
// produced again to the home partition and counted there, and a record
// without header schema=sluice.usage.v1 is not counted (route.go,
// docs/producers.md). A flush takes what
// every partition processed since the last one and, in this order:
//
//  1. publishes the new signals to sluice.signals.v1, and re-routed records
//     to their home partitions (retrying while Kafka refuses; nothing is
//     fetched meanwhile);
//  2. hands the partition's rows (raw events, rollups, quota state, signals
//     log) to the partition's writer, which stores them in ClickHouse in
//     flush order, retrying with back-off while ClickHouse is unreachable;
//  3. the writer commits the offset after the batch's last event only once
//     ClickHouse stored it.
//
// Signals come first so that enforcement never waits for ClickHouse: during
// a ClickHouse outage events are still read and counted and a tenant that
// crosses 100% still gets its quota_exhausted, while nothing is committed
// past what ClickHouse holds. The rows waiting for ClickHouse are bounded
// by max_unwritten_rows; beyond it fetching pauses (the events stay in
// Kafka) until ClickHouse takes them. Signal ids are deterministic, so the
// signals of a batch that a crash kept from ClickHouse are published again,
// with the same ids, when its events are re-read: consumers fold them.
//
// A flush cut short in step 1 — its deadline passed: a stop (SIGTERM), a
// revoke's flush past shutdown_timeout, a partition-count refresh with Kafka
// slow — keeps what it drained: the next flush publishes it again, then
// hands it to the writer ahead of anything newer (counted in
// sluice_aggregator_flushes_cut_short_total). A writer commits only the
// batches it was handed, so no commit passes an event whose rows and
// signals were not handed to it; a write or commit that fails is retried
// by the writer or re-done by the next flush, and a process killed at any
// step leaves the offset before what ClickHouse lacks (TestFlushFaults
// lands a failure, a SIGTERM and a SIGKILL on each step).
//
// On assignment, before fetching starts, the instance replays from
// ClickHouse every distinct event id of the partition's tenants: those
// stored for the partition below the committed offset, and theirs stored
// under other partitions (signals suppressed); consumption resumes at the
// committed offset: events between the commit and a crash are read again,
// re-written (ReplacingMergeTree folds them) and re-signalled with the same
// deterministic ids. So after kill -9 at any moment the totals equal the
// sum over distinct ids in ClickHouse, and consumers see each signal id at
// least once.
//
// # Adding partitions
//
// Adding partitions to the usage topic moves tenants to new home
// partitions. The aggregator reads the partition count every 10 s (and on
// every assignment) and then re-routes by the new count. A tenant new to a
// partition whose home under an earlier count was another partition is
// rebuilt from what ClickHouse stored for it, across partitions, before its
// first event there is counted, so its month so far carries over (this
// needs ClickHouse: during an outage the tenant's events wait, like an
// evicted tenant's, while every other tenant's are counted; restore.go). Row
// versions of quota_state and usage_minute are the partition count shifted
// by chstore.VersionShift plus the offset, so they only grow per tenant:
// the new home's rows win over the old home's under FINAL although its
// offsets are lower. The old home may go on counting the tenant for the
// seconds before it sees the new count, so the new home rebuilds the
// tenant only once the old home stored all it counted under the old
// count: offset commits carry the count they were made under, and the new
// home waits, partition paused at the tenant's first event, until every
// old home committed under the new one (the hand-over, handover.go).
// Settlements of estimates that straddle the move are stored under two
// partitions, and usage_events (versioned by offset) may keep the
// estimate.
//
// # Anomalies
//
// Besides quota signals the aggregator emits kind anomaly per tenant ×
// model and tenant × "*", with Attributes detector (= type) error_ratio,
// slow_call or rate_spike, ratio, requests, threshold and state firing or
// resolved; error_ratio and slow_call also carry breaker (the detector
// name), which the alerter reports as a breaker opening and the enforcer
// turns into a breaker. Thresholds, minimum calls and windows come from the
// tenant's policy (breakers.error_ratio, breakers.slow_call); rate_spike
// compares a minute's tokens with the 60-minute baseline (spike_multiplier,
// spike_min_tokens). Signals are on change, except that while a condition
// persists a fresh firing signal is emitted once per window: the enforcer
// re-evaluates a half-open breaker on the next anomaly signal. A half-open
// breaker is judged by its probes, though: a settled event marked as a
// probe (attribute breaker_probe, sdk/go/flags.ProbeAttribute) that
// failed emits a firing signal with probe=failed at once, and
// half_open_probes successful ones in a row a resolved one with
// probe=passed, however few calls the window holds (see
// internal/tally/anomaly.go). Everything is event time, so replays give
// the same signals and ids.
//
// # Event time
//
// Periods and the partition's clock follow event time, so an event stamped
// in the future would roll a tenant's hour, day and month at once (and
// move the clock idle eviction reads). The aggregator bounds it on its own,
// whatever ingest was configured to accept: an event stamped more than
// max_event_future ahead of its Kafka record's timestamp (capped by this
// host's clock) is stored in ClickHouse but held uncounted in memory until
// a later record's time comes within max_event_future of it, then counted
// in its own period as if it had just arrived. A period therefore rolls at
// most max_event_future early. Up to future_hold_capacity events are held
// per partition; beyond that such an event is refused, neither counted nor
// stored, logged and counted in sluice_aggregator_events_total with result
// too_far_ahead. A rebuild holds them again (measured against this host's
// clock) or counts those whose time has come.
//
// # Operator overrides
//
// Quota overrides written by the enforcer's admin API to the compacted
// admin topic (topics.admin, sluice.admin.v1) replace a quota's limit in the state too,
// so tiers, signals, quota_state and alerts follow the override, its lift
// and its expiry at once; see admin.go. The topic is read to its end
// before the group is joined.
//
// # What a restore announces
//
// A restored state (rebuilt from ClickHouse or a snapshot, or a tenant
// restored after eviction) replays its events without signals, under the
// policy and overrides in force now. A limit lowered, or an override that
// expired, while no aggregator ran puts a tenant at 100% with no crossing
// to announce, and nothing would block it. So after every restore the
// state's tier and exhaustion are compared with what quota_state says was
// announced for each open period, and where the limit differs from the
// one announced under (or nothing was announced), the difference goes out
// as tier_crossed and quota_exhausted signals with the partition's first
// flush (restore.go, tally.AnnounceRestored;
// sluice_aggregator_restore_announcements_total counts them).
//
// # Bounded state
//
// A tenant without events for idle_evict_after of event time is dropped
// from memory after a flush has stored its rows; when it sends again its
// distinct stored events are replayed from ClickHouse (as on partition
// assignment, for that tenant only) before the event is counted, so its
// totals, tiers and signals are those it would have had without eviction.
// The replay runs beside the poll loop: the returning tenant's events wait
// for it (and offsets are committed no further than the first of them),
// every other tenant's are counted and signalled meanwhile (restore.go).
package aggregator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Config is the aggregator's section of the Sluice configuration.
type Config struct {
	// Consumer is the group the aggregator instances share the usage
	// topic's partitions in.
	kafkaconn.Consumer `yaml:"consumer"`
	BatchEvents        int           `yaml:"batch_events" help:"flush a partition's batch at this many events (also the poll size)"`
	FlushInterval      time.Duration `yaml:"flush_interval" help:"flush pending batches at least this often"`
	// MaxUnwrittenRows bounds what a ClickHouse outage may pile up in
	// memory: signals keep flowing while rows wait for the store, up to
	// this many; then fetching pauses until ClickHouse takes them.
	MaxUnwrittenRows int           `yaml:"max_unwritten_rows" help:"rows (events, rollups, quota state, signals log) flushed but not yet stored in ClickHouse that may be held while it is unreachable; beyond it fetching pauses"`
	RetryMin         time.Duration `yaml:"retry_min" help:"first back-off when ClickHouse or Kafka refuses a flush"`
	RetryMax         time.Duration `yaml:"retry_max" help:"longest back-off between flush attempts"`
	// StoreInterval spaces a partition's ClickHouse writes and offset
	// commits: the flushes in between, whose signals are published at
	// once, are stored together (see writer).
	StoreInterval time.Duration `yaml:"store_interval" help:"a partition's rows are written to ClickHouse, and its offset committed, at most this often; the flushes in between (their signals already published) go into the same inserts. 0 writes each flush as soon as the previous write ends"`
	// WriteTimeout bounds one ClickHouse write attempt: a connection that
	// died without a reset (a network cut) would otherwise hold the
	// partition's writer forever, and nothing after it would be stored.
	// SnapshotInterval: how often a partition's state is snapshotted into
	// ClickHouse (aggregator_snapshots), so that a restart loads it and
	// replays only the events stored since, instead of a month and a half
	// of them. A graceful stop also snapshots every partition at its
	// final committed offset, as far as shutdown_timeout allows, so that a
	// rolling restart replays nothing. The default, one minute, bounds what
	// a restart after a crash replays to a minute of the partition's events:
	// about 1,200,000 events at 20,000 events/s on one partition, ~10 s of
	// replay, so that with the load of a 1,000,000-key snapshot a restart
	// stays within 30 s (bench/README.md, "Snapshots"). Its cost per
	// interval grows with the keys: about 5.5 s of one core per 1,000,000
	// tenant × model keys to encode, off the poll loop (only the
	// snapshotted partition waits meanwhile; the others keep flowing), and
	// ~540 bytes per key written to ClickHouse, the previous snapshot
	// deleted once the new one's offset is committed. At the thousands of
	// keys of most deployments both are negligible.
	SnapshotInterval time.Duration `yaml:"snapshot_interval" help:"snapshot each partition's state into ClickHouse this often, and at a graceful stop, so a restart loads it and replays only the events stored since; 0 turns snapshots off (a restart replays from the start of the previous month)"`
	WriteTimeout     time.Duration `yaml:"write_timeout" help:"longest one ClickHouse write attempt may take before it is abandoned and retried"`
	ShutdownTimeout  time.Duration `yaml:"shutdown_timeout" help:"time allowed to flush and commit on shutdown, then to snapshot the partitions (a snapshot not stored in time is left out: its partition's next owner replays since the previous one)"`

	Hysteresis        float64       `yaml:"hysteresis" help:"percentage points below a tier before it is left"`
	PredictionHorizon time.Duration `yaml:"prediction_horizon" help:"signal exhaustion predicted sooner than this"`
	DedupCapacity     int           `yaml:"dedup_capacity" help:"event ids remembered per partition for dedup and settlement (FIFO beyond)"`
	SlowCallMS        int64         `yaml:"slow_call_ms" help:"latency from which a request counts as a slow call in the minute rollups (the slow_call breaker uses the policy's breakers.slow_call.slow_call_ms)"`
	SpikeMultiplier   float64       `yaml:"spike_multiplier" help:"a minute whose tokens exceed this multiple of the 60-minute baseline is a rate_spike anomaly"`
	SpikeMinTokens    int64         `yaml:"spike_min_tokens" help:"tokens a minute must carry at least to count as a rate spike"`
	// IdleEvictAfter bounds memory: a tenant silent for this long (in event
	// time) is dropped, and rebuilt from ClickHouse when it sends again.
	IdleEvictAfter time.Duration `yaml:"idle_evict_after" help:"forget a tenant after this much event time without events (rebuilt from ClickHouse when it returns)"`
	// MaxEventFuture and FutureHoldCapacity keep one event stamped ahead
	// (a gateway's wrong clock, a direct producer; ingest's own bound may
	// be off) from rolling a tenant's periods early or evicting a
	// partition's tenants. See "Event time" in the package doc.
	MaxEventFuture     time.Duration `yaml:"max_event_future" help:"events stamped further ahead of the Kafka record time (capped by this host's clock) are held uncounted until their time comes within this bound"`
	FutureHoldCapacity int           `yaml:"future_hold_capacity" help:"events held per partition for being ahead; beyond it such an event is refused (not counted, not stored) and counted in sluice_aggregator_events_total{result=\"too_far_ahead\"}"`

	// onFold is set by Run: the metric and log line for events counted
	// under model "other" beyond a tenant's max_models (tally.Options.OnFold).
	onFold func(tenant, model string, maxModels int, first bool)
}

// DefaultConfig returns the settings the aggregator ships with.
func DefaultConfig() Config {
	o := tally.DefaultOptions()
	return Config{
		Consumer:           kafkaconn.Consumer{Group: "sluice-aggregator", SessionTimeout: 45 * time.Second},
		BatchEvents:        50_000,
		FlushInterval:      time.Second,
		MaxUnwrittenRows:   1_000_000,
		RetryMin:           200 * time.Millisecond,
		RetryMax:           30 * time.Second,
		StoreInterval:      500 * time.Millisecond,
		WriteTimeout:       20 * time.Second,
		ShutdownTimeout:    20 * time.Second,
		SnapshotInterval:   time.Minute,
		Hysteresis:         o.Hysteresis,
		PredictionHorizon:  o.Horizon,
		DedupCapacity:      o.DedupCapacity,
		SlowCallMS:         o.SlowCallMS,
		SpikeMultiplier:    o.SpikeMultiplier,
		SpikeMinTokens:     o.SpikeMinTokens,
		IdleEvictAfter:     o.IdleEvict,
		MaxEventFuture:     o.MaxFuture,
		FutureHoldCapacity: o.HoldCapacity,
	}
}

// Validate reports every setting out of range, naming the field and limit.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := c.Consumer.Validate("consumer"); err != nil {
		errs = append(errs, err)
	}
	if c.BatchEvents < 1 || c.BatchEvents > 1_000_000 {
		bad("batch_events: %d is outside 1..1000000", c.BatchEvents)
	}
	if c.FlushInterval < 10*time.Millisecond || c.FlushInterval > time.Minute {
		bad("flush_interval: %v is outside 10ms..1m", c.FlushInterval)
	}
	if c.MaxUnwrittenRows < 1000 || c.MaxUnwrittenRows > 100_000_000 {
		bad("max_unwritten_rows: %d is outside 1000..100000000", c.MaxUnwrittenRows)
	}
	if c.SnapshotInterval != 0 && (c.SnapshotInterval < time.Second || c.SnapshotInterval > 24*time.Hour) {
		bad("snapshot_interval: %v is outside 1s..24h (0 turns snapshots off)", c.SnapshotInterval)
	}
	if c.StoreInterval < 0 || c.StoreInterval > time.Minute {
		bad("store_interval: %v is outside 0..1m", c.StoreInterval)
	}
	if c.WriteTimeout <= 0 || c.WriteTimeout > 10*time.Minute {
		bad("write_timeout: %v is outside (0, 10m]", c.WriteTimeout)
	}
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin || c.RetryMax > 10*time.Minute {
		bad("retry_min, retry_max: need 0 < retry_min <= retry_max <= 10m (got %v, %v)", c.RetryMin, c.RetryMax)
	}
	if c.ShutdownTimeout < time.Second || c.ShutdownTimeout > 10*time.Minute {
		bad("shutdown_timeout: %v is outside 1s..10m", c.ShutdownTimeout)
	}
	if c.Hysteresis < 0 || c.Hysteresis > 50 {
		bad("hysteresis: %v is outside 0..50 percentage points", c.Hysteresis)
	}
	if c.PredictionHorizon < time.Minute || c.PredictionHorizon > 31*24*time.Hour {
		bad("prediction_horizon: %v is outside 1m..744h", c.PredictionHorizon)
	}
	if c.DedupCapacity < 1000 || c.DedupCapacity > 50_000_000 {
		bad("dedup_capacity: %d is outside 1000..50000000", c.DedupCapacity)
	}
	if c.SlowCallMS < 0 || c.SlowCallMS > schemas.MaxLatencyMS {
		bad("slow_call_ms: %d is outside 0..%d", c.SlowCallMS, schemas.MaxLatencyMS)
	}
	if c.SpikeMultiplier < 1.5 || c.SpikeMultiplier > 1000 {
		bad("spike_multiplier: %v is outside 1.5..1000", c.SpikeMultiplier)
	}
	if c.SpikeMinTokens < 1 || c.SpikeMinTokens > 1_000_000_000_000 {
		bad("spike_min_tokens: %d is outside 1..1000000000000", c.SpikeMinTokens)
	}
	if c.IdleEvictAfter < 5*time.Minute || c.IdleEvictAfter > 31*24*time.Hour {
		bad("idle_evict_after: %v is outside 5m..744h", c.IdleEvictAfter)
	}
	if c.MaxEventFuture < time.Second || c.MaxEventFuture > 24*time.Hour {
		bad("max_event_future: %v is outside 1s..24h (keep it at least ingest.max_event_future plus the clock skew between hosts)", c.MaxEventFuture)
	}
	if c.FutureHoldCapacity < 0 || c.FutureHoldCapacity > 1_000_000 {
		bad("future_hold_capacity: %d is outside 0..1000000", c.FutureHoldCapacity)
	}
	return errors.Join(errs...)
}

func (c Config) options() tally.Options {
	return tally.Options{Hysteresis: c.Hysteresis, Horizon: c.PredictionHorizon, DedupCapacity: c.DedupCapacity, SlowCallMS: c.SlowCallMS,
		SpikeMultiplier: c.SpikeMultiplier, SpikeMinTokens: c.SpikeMinTokens, IdleEvict: c.IdleEvictAfter,
		MaxFuture: c.MaxEventFuture, HoldCapacity: c.FutureHoldCapacity, OnFold: c.onFold}
}

// modelFolded counts an event folded into model "other" and logs the
// first fold of each tenant (per partition state, so again after a
// rebalance or restart): the metric has no tenant label, because the
// tenants that hit the cap are the ones that would blow up its cardinality.
func (a *aggregator) modelFolded(tenant, model string, maxModels int, first bool) {
	a.m.modelsCapped.Inc()
	if first {
		a.log.Warn("tenant reached max_models: usage of further models is counted as model \""+policy.OtherModel+"\" (tenant totals stay exact); raise max_models in the policy if these models are real",
			"tenant", tenant, "model", model, "max_models", maxModels)
	}
}

// New returns the aggregator of cfg in env. Once started it consumes until
// stopped, then flushes and commits what it holds (within ShutdownTimeout)
// and leaves the group. It has no API of its own (Addr is "").
func New(cfg Config, env platform.Env) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.aggregator", err)
	}
	if err := env.Topics.Validate(); err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	return platform.NewService("aggregator", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, ready)
	}), nil
}

// run consumes until ctx ends; ready is called once the group is joined
// and the readiness checks are registered.
func run(ctx context.Context, cfg Config, env platform.Env, ready func(addr string)) error {
	env = env.Named("aggregator")
	log := env.Logger
	// The signing key first: a start that cannot sign its signals is
	// refused before it connects to anything.
	auth, err := signalauth.Open(env.SignalAuth, log)
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	if env.Policy.File == "" {
		return errors.New("aggregator: policy.file is required: the aggregator counts usage against the quota policy")
	}
	watcher, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, log)
	if err != nil {
		return fmt.Errorf("aggregator: policy: %w", err)
	}
	conn, err := chconn.Open(ctx, env.ClickHouse)
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	defer conn.Close()

	a := newAggregator(cfg, env, watcher)
	a.cfg.onFold = a.modelFolded
	a.auth = auth
	a.store = chstore.New(conn, a.costFunc, cfg.SlowCallMS)
	// The operator overrides in force, read to the end before the group is
	// joined: no partition is rebuilt or evaluated without them.
	if a.admin, err = newAdminFollower(ctx, env.Kafka, env.Topics.Admin, auth); err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	defer a.admin.cl.Close()
	if err := kafkaconn.ReadToEnd(ctx, a.admin.cl, env.Topics.Admin, func(r *kgo.Record) { a.adminRecord(r) }); err != nil {
		return fmt.Errorf("aggregator: read admin topic %s: %w", env.Topics.Admin, err)
	}
	a.followSections() // the tenants and plans in force before any partition
	cl, err := kafkaconn.NewClient(env.Kafka, a.kafkaOptions()...)
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	a.cl = cl
	if err := kafkaconn.EnsureTopics(ctx, cl, env.Kafka, env.Topics.Usage, env.Topics.Signals); err != nil {
		cl.Close()
		return fmt.Errorf("aggregator: %w", err)
	}
	// The aggregator always runs with the policy, so it keeps ClickHouse's
	// prices table in step with it: the cost views price usage from the
	// first event, not from the reconciler's first run.
	prices, err := pricetable.NewFollower(conn, log, env.Metrics, "aggregator")
	if err != nil {
		cl.Close()
		return fmt.Errorf("aggregator: %w", err)
	}
	env.Health.AddReadiness("aggregator-kafka", kafkaconn.Ready(cl))
	env.Health.AddReadiness("aggregator-clickhouse", chconn.Ready(conn))
	env.Health.AddReadiness("aggregator-partitions", a.partitionsReady)
	defer env.Health.RemoveReadiness("aggregator-kafka")
	defer env.Health.RemoveReadiness("aggregator-clickhouse")
	defer env.Health.RemoveReadiness("aggregator-partitions")

	// One group, one cancellation: the consumer and the policy poller stop
	// together. The consumer cancels the group when it ends on its own (its
	// client closed), so Run never outlives its consumer.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(ctx)
	_ = prices.Apply(gctx, watcher.Current()) // a failure is logged, counted and retried
	g.Go(func() error {
		return watcher.Follow(gctx, func(p *policy.Policy) {
			a.policyChanged(p)
			_ = prices.Apply(gctx, p)
		})
	})
	g.Go(func() error { return prices.RetryFailed(gctx) })
	g.Go(func() error { return a.followAdmin(gctx, time.Second) })
	ready("")
	g.Go(func() error {
		defer stop()
		log.Info("aggregator consuming", "topic", env.Topics.Usage, "group", cfg.Group, "policy_file", env.Policy.File)
		a.loop(gctx)
		return a.shutdown(cfg.ShutdownTimeout)
	})
	return g.Wait()
}

// partitionsReady is the readiness check of the partitions' states: an instance
// restoring newly assigned partitions (from their snapshots and the events
// stored since, or from every event) counts nothing of them yet, so a
// rolling restart should wait before stopping the next instance.
func (a *aggregator) partitionsReady(context.Context) error {
	if n := a.restoring.Load(); n > 0 {
		return fmt.Errorf("%d assigned partitions are still being restored from ClickHouse (sluice_aggregator_rebuild_seconds); ready once they are", n)
	}
	return nil
}

// shutdown flushes and commits everything held, snapshots the partitions
// whose state moved since their last snapshot (finalSnapshots), then
// leaves the group (whose revoke callback finds nothing left to do),
// within grace. The order is that of every flush: signals, then
// ClickHouse, then the offset commit; what it cannot finish is re-read by
// the next owner. The snapshots come after the commit: a stop that runs
// out of grace loses only them, and the next owner replays since the
// previous one.
func (a *aggregator) shutdown(grace time.Duration) error {
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	a.mu.Lock()
	ferr := a.flushAll(sctx)
	for _, p := range a.parts {
		if err := p.w.wait(sctx); err != nil && ferr == nil {
			ferr = err
		}
	}
	if ferr == nil {
		a.finalSnapshots(sctx)
	}
	// Stop the writers before leaving the group, so that the revoke
	// callback Close runs does not wait a second grace for ClickHouse.
	for _, p := range a.parts {
		a.stop(p.w)
		p.dropRestores()
	}
	a.mu.Unlock()
	a.cl.Close()
	if ferr != nil {
		return fmt.Errorf("aggregator: final flush: %w (uncommitted events will be re-read by the next owner)", ferr)
	}
	a.log.Info("aggregator stopped")
	return nil
}
