package alerter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/alertmanager"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/engine"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// New returns the alerter of cfg in env. Once started it consumes signals
// and notifies until stopped, then stops consuming, flushes the alerts held
// for grouping and sends what is queued within cfg.ShutdownTimeout. Its
// loops share one errgroup: the first that fails stops the others, and the
// service stops with that error. It has no API of its own (Addr is "").
func New(cfg Config, env platform.Env) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.alerter", err)
	}
	if err := env.Topics.Check("signals"); err != nil {
		return nil, fmt.Errorf("alerter: %w", err)
	}
	if err := env.Topics.Check("admin"); err != nil && env.Policy.File != "" {
		return nil, fmt.Errorf("alerter: %w (the tenants and plans of the admin API are laid over policy.file)", err)
	}
	if cfg.stateTopic() == env.Topics.Signals {
		return nil, fmt.Errorf("services.alerter.state_topic: %q must differ from topics.signals", cfg.stateTopic())
	}
	return platform.NewService("alerter", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, ready)
	}), nil
}

// readRecords lays the admin API's tenants and plans (topics.admin) over
// the policy, read to the end before any signal is routed, so that a
// tenant made at runtime is alerted in its own channels and zone; it
// returns the follower's loop and its stop. Without a policy there is
// nothing to lay them over, and both do nothing.
func readRecords(ctx context.Context, env platform.Env, watcher *policy.Watcher) (follow func(context.Context) error, stop func(), err error) {
	if watcher == nil {
		return func(context.Context) error { return nil }, func() {}, nil
	}
	f, stop, err := controlplane.FollowPolicy(ctx, "alerter", env, watcher, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("alerter: admin topic: %w", err)
	}
	if err := f.CatchUp(ctx); err != nil {
		stop()
		return nil, nil, fmt.Errorf("alerter: read admin topic %s: %w", env.Topics.Admin, err)
	}
	return f.Run, stop, nil
}

func run(ctx context.Context, cfg Config, env platform.Env, ready func(addr string)) error {
	env = env.Named("alerter")
	var watcher *policy.Watcher
	if env.Policy.File != "" {
		var err error
		// The channel kinds check the policy's channel definitions, so a
		// bad one fails the load (or keeps the previous policy on reload).
		if watcher, err = policy.NewWatcher(env.Policy.File, env.Policy.Reload, env.Logger,
			policy.WithChannelCheck(channelKinds.Check)); err != nil {
			return fmt.Errorf("policy.file: %w", err)
		}
	}
	followRecords, stopRecords, err := readRecords(ctx, env, watcher)
	if err != nil {
		return err
	}
	defer stopRecords()
	p, err := newPipeline(cfg, env, watcher)
	if err != nil {
		return err
	}
	cl, err := kafkaconn.NewClient(env.Kafka,
		kgo.ConsumerGroup(cfg.Group),
		// No topic yet: the group is joined once the state store exists
		// (AddConsumeTopics below), or an assignment could reach restore
		// before it and consume without the alerts' state.
		kgo.SessionTimeout(cfg.SessionTimeout),
		// Offsets are committed by persist, only once the alert states the
		// signals before them produced are on the state topic.
		kgo.DisableAutoCommit(),
		// A group that never committed rebuilds its state from the start
		// of the retained signals.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Rebalances wait until the signals of a poll are applied, so that
		// revoking persists and commits exactly what was applied.
		kgo.BlockRebalanceOnPoll(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.OnPartitionsAssigned(func(ctx context.Context, _ *kgo.Client, got map[string][]int32) {
			p.restore(ctx, got[env.Topics.Signals])
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
			// Also called while the client closes, with ctx cancelled:
			// the last save must still run.
			p.persist(context.WithoutCancel(ctx))
			p.forget(lost[env.Topics.Signals])
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) { p.forget(lost[env.Topics.Signals]) }),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, cl, env.Kafka, env.Topics.Signals); err != nil {
		return err
	}
	stateParts, err := ensureStateTopic(ctx, cl, env.Kafka, env.Topics.Signals, cfg.stateTopic())
	if err != nil {
		return err
	}
	p.cl = cl
	p.store = &stateStore{topic: cfg.stateTopic(), kcfg: env.Kafka, cl: cl, log: env.Logger, partitions: stateParts,
		auth: p.auth.For(signalauth.AlerterState), refused: p.stateRefused, unsigned: p.stateUnsigned}
	cl.AddConsumeTopics(env.Topics.Signals)
	env.Health.AddReadiness("alerter-kafka", kafkaconn.Ready(cl))
	defer env.Health.RemoveReadiness("alerter-kafka")

	env.Logger.Info("alerter running", "topic", env.Topics.Signals, "group", cfg.Group, "state_topic", cfg.stateTopic(), "channels", p.dispatch.Channels())
	g, ctx := errgroup.WithContext(ctx)
	// The dispatcher outlives ctx: it drains its queues for
	// cfg.ShutdownTimeout once the tick loop, the engine's only deliverer, has
	// flushed what it held for grouping. Its context is ctx's values without
	// ctx's cancellation; runTicks cancels it.
	dctx, stopDispatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDispatch()
	g.Go(func() error { return p.dispatch.Run(dctx, cfg.ShutdownTimeout) })
	g.Go(func() error {
		defer stopDispatch()
		p.runTicks(ctx, cfg.Tick)
		return nil
	})
	g.Go(func() error { p.consume(ctx, cl); return nil })
	if watcher != nil {
		g.Go(func() error { return watcher.Follow(ctx, p.applyPolicy) })
		g.Go(func() error { return followRecords(ctx) })
	}
	ready("")
	err = g.Wait()
	env.Logger.Info("alerter stopped")
	return err
}

// runTicks advances the engine every tick and persists what changed, until
// ctx ends; then it flushes the alerts held for grouping and persists once
// more, so that nothing is lost at shutdown. Only Tick and Flush deliver,
// so once runTicks returns nothing more reaches the dispatcher.
func (p *pipeline) runTicks(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.engine.Flush(time.Now())
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), stateTimeout)
			p.persist(last)
			cancel()
			return
		case now := <-t.C:
			p.engine.Tick(now)
			p.persist(ctx)
		}
	}
}

// stateTimeout bounds one write of alert states and one offset commit.
const stateTimeout = 10 * time.Second

// Deliver is the engine's Output. Without a state store (tests that drive
// the engine directly) it hands m to the dispatcher at once; with one, m
// waits in the outbox until persist has written the state that says it
// was sent, so that a crash can lose a notification in flight but never
// make a restarted alerter send it again.
func (p *pipeline) Deliver(ch string, m alert.Message) {
	if p.store == nil {
		p.dispatch.Deliver(ch, m)
		return
	}
	p.outMu.Lock()
	p.outbox = append(p.outbox, outMsg{ch, m})
	p.outMu.Unlock()
}

type outMsg struct {
	channel string
	msg     alert.Message
}

// persist writes the alert states changed since the last call, then
// commits the offsets of the signals applied before them, then releases
// the outbox to the dispatcher. The order is the guarantee: an offset is
// committed only when the state its signals produced is stored, and a
// notification leaves only when the state that records it is stored. If
// the write fails the notifications still go (alerting beats dedup), the
// offsets stay uncommitted and the states are written on the next call.
func (p *pipeline) persist(ctx context.Context) {
	if p.store == nil {
		return
	}
	p.persistMu.Lock()
	defer p.persistMu.Unlock()
	// Offsets first: every signal applied before this snapshot has marked
	// its keys dirty already, so TakeDirty below includes its effects.
	offs := p.applied()
	changes := p.engine.TakeDirty()
	held, heldChanged := p.engine.TakeHeld()
	p.outMu.Lock()
	out := p.outbox
	p.outbox = nil
	p.outMu.Unlock()
	saved := true
	if len(changes) > 0 || heldChanged {
		sctx, cancel := context.WithTimeout(ctx, stateTimeout)
		n, err := p.store.save(sctx, changes, held, heldChanged, p.partitionOf)
		cancel()
		if err != nil {
			saved = false
			p.engine.Redirty(changes)
			if heldChanged {
				p.engine.RedirtyHeld()
			}
			p.stateFailures.Inc()
			// Every tick retries: log the first few and then every 60th of
			// a run of failures, not one line a tick.
			if p.saveFailing++; p.saveFailing <= 3 || p.saveFailing%60 == 0 {
				p.log.Error("alert state not saved; notifications go out anyway and signal offsets stay uncommitted until a save succeeds",
					"state_topic", p.cfg.stateTopic(), "changes", len(changes), "failures_in_a_row", p.saveFailing, "err", err)
			}
		} else {
			p.stateWrites.Add(float64(n))
			if p.saveFailing > 0 {
				p.log.Info("alert state saved again", "state_topic", p.cfg.stateTopic(), "after_failures", p.saveFailing)
				p.saveFailing = 0
			}
		}
	}
	if saved && len(offs) > 0 {
		p.commit(ctx, offs)
	}
	for _, o := range out {
		p.dispatch.Deliver(o.channel, o.msg)
	}
}

// applied returns the next offset of every partition whose applied
// signals moved past the last commit.
func (p *pipeline) applied() map[int32]kgo.EpochOffset {
	p.offMu.Lock()
	defer p.offMu.Unlock()
	var offs map[int32]kgo.EpochOffset
	for part, o := range p.handled {
		if c, ok := p.committed[part]; !ok || c.Offset != o.Offset {
			if offs == nil {
				offs = map[int32]kgo.EpochOffset{}
			}
			offs[part] = o
		}
	}
	return offs
}

// commit commits offs; a failure is logged and retried by the next
// persist (a restart in between re-applies a few signals, which changes
// nothing: applying a signal twice yields the same state).
func (p *pipeline) commit(ctx context.Context, offs map[int32]kgo.EpochOffset) {
	cctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	if cerr := kafkaconn.CommitSync(cctx, p.cl, map[string]map[int32]kgo.EpochOffset{p.signalsTopic: offs}); cerr != nil {
		p.commitFailures.Inc()
		p.log.Warn("signal offsets not committed; retrying with the next save", "topic", p.signalsTopic, "err", cerr)
		return
	}
	p.offMu.Lock()
	for part, o := range offs {
		p.committed[part] = o
	}
	p.offMu.Unlock()
}

// restore loads the stored alert states of newly assigned signal
// partitions before their signals are consumed (franz-go calls it before
// fetching them). It retries until it succeeds or the client closes: going
// on without the state would announce again every alert still firing.
func (p *pipeline) restore(ctx context.Context, parts []int32) {
	if p.store == nil || len(parts) == 0 {
		return
	}
	for attempt := 1; ; attempt++ {
		recs, err := p.store.load(ctx, parts)
		if err == nil {
			var batch []*engine.Record
			var held []engine.Held
			p.partMu.Lock()
			for _, r := range recs {
				if r.held != nil {
					held = append(held, *r.held)
					for _, a := range r.held.Alerts {
						p.tenantPart[a.Key.Tenant] = r.part
					}
					continue
				}
				p.tenantPart[r.rec.Key.Tenant] = r.part
				batch = append(batch, r.rec)
			}
			p.partMu.Unlock()
			p.engine.Restore(batch)
			p.engine.RestoreHeld(held)
			p.stateRestored.Add(float64(len(batch)))
			p.log.Info("alert state restored", "partitions", parts, "alerts", len(batch), "held_groups", len(held))
			return
		}
		if ctx.Err() != nil {
			return
		}
		wait := min(time.Duration(attempt)*time.Second, 10*time.Second)
		p.log.Error("alert state not loaded; signals of these partitions wait", "partitions", parts, "attempt", attempt, "retry_in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}

// partitionOf is the signals partition of tenant, where its state goes.
func (p *pipeline) partitionOf(tenant string) (int32, bool) {
	p.partMu.Lock()
	defer p.partMu.Unlock()
	part, ok := p.tenantPart[tenant]
	return part, ok
}

// applyPolicy is the watcher's reaction to a reloaded policy: routing
// reads the policy in force on every delivery, so only the channel
// definitions need applying.
func (p *pipeline) applyPolicy(pol *policy.Policy) {
	if err := p.syncChannels(pol); err != nil {
		p.log.Error("policy channels not applied", "err", err)
	}
}

// pipeline is the alerter without its Kafka consumer and clock, which Run
// supplies and tests replace.
type pipeline struct {
	cfg Config
	// signalsTopic is where signals come from (topics.signals): the
	// topic whose offsets persist commits.
	signalsTopic string
	log          *slog.Logger
	watcher      *policy.Watcher
	render       *message.Renderer
	dispatch     *notify.Dispatcher
	metrics      *notify.Metrics
	engine       *engine.Engine
	routes       map[string]engine.Route
	client       *http.Client

	signals      *prometheus.CounterVec
	invalid      prometheus.Counter
	invalidCount atomic.Int64
	// auth verifies every signal record before the engine sees it: a
	// forged period_reset would resolve an alert, a forged tier cross
	// page an on-call.
	auth         *signalauth.Auth
	unauthentic  prometheus.Counter
	unauthenticN atomic.Int64

	// tenantPart is the signals partition of the tenants the engine holds
	// state of, and of those seen since the last prune (see
	// rememberPartition); partPruneAt is the size that prunes it next.
	partMu           sync.Mutex
	tenantPart       map[string]int32
	partPruneAt      int
	partitionsPruned prometheus.Counter

	// Persistence (Run only; nil in tests that drive the engine): see
	// persist.
	cl        *kgo.Client
	store     *stateStore
	persistMu sync.Mutex
	// saveFailing counts failed saves in a row (under persistMu).
	saveFailing int
	outMu       sync.Mutex
	outbox      []outMsg
	// handled is the next offset per signals partition after the signals
	// applied so far; committed what was last committed.
	offMu     sync.Mutex
	handled   map[int32]kgo.EpochOffset
	committed map[int32]kgo.EpochOffset

	stateWrites, stateFailures, stateRestored, commitFailures prometheus.Counter
	stateRefused, stateUnsigned                               prometheus.Counter
}

func newPipeline(cfg Config, env platform.Env, watcher *policy.Watcher) (*pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	render, err := message.New(cfg.Language, cfg.TemplatesDir, cfg.Links, cfg.IncidentListMax)
	if err != nil {
		return nil, fmt.Errorf("services.alerter.templates_dir: %w", err)
	}
	auth, err := signalauth.Open(env.SignalAuth, env.Logger)
	if err != nil {
		return nil, fmt.Errorf("alerter: %w", err)
	}
	nm, err := notify.NewMetrics(env.Metrics)
	if err != nil {
		return nil, err
	}
	p := &pipeline{
		cfg: cfg, signalsTopic: env.Topics.Signals, log: env.Logger, watcher: watcher, render: render, auth: auth,
		dispatch:   notify.NewDispatcher(env.Logger, nm),
		metrics:    nm,
		routes:     map[string]engine.Route{},
		client:     &http.Client{},
		tenantPart: map[string]int32{},
		handled:    map[int32]kgo.EpochOffset{},
		committed:  map[int32]kgo.EpochOffset{},
	}
	for id, t := range cfg.Tenants {
		if p.routes[id], err = t.route(id, nil); err != nil {
			return nil, err
		}
	}
	if cfg.Alertmanager.URL != "" {
		am, err := alertmanager.New(cfg.Alertmanager.URL, cfg.Alertmanager.Hold, render, p.client)
		if err != nil {
			return nil, err
		}
		if err := p.dispatch.Set(engine.AlertmanagerChannel, am, cfg.Alertmanager.Delivery); err != nil {
			return nil, err
		}
	}
	var pol *policy.Policy
	if watcher != nil {
		pol = watcher.Current()
	}
	if err := p.syncChannels(pol); err != nil {
		return nil, err
	}
	if p.engine, err = engine.New(cfg.Rules, p.route, p); err != nil {
		return nil, err
	}
	if err := p.registerMetrics(env.Metrics); err != nil {
		return nil, err
	}
	return p, nil
}

// syncChannels creates or updates a sender for every direct channel the
// alerter config and the policy define (the policy wins on a name clash).
func (p *pipeline) syncChannels(pol *policy.Policy) error {
	defs := p.cfg.Channels
	if pol != nil {
		defs = pol.Channels()
		for kind, named := range p.cfg.Channels {
			if defs[kind] == nil {
				defs[kind] = map[string]policy.ChannelSettings{}
			}
			for name, s := range named {
				if _, clash := defs[kind][name]; !clash {
					defs[kind][name] = s
				}
			}
		}
	}
	deps := channel.Deps{Render: p.render, Client: p.client}
	var errs []error
	for kind, named := range defs {
		for name, settings := range named {
			s, err := channelKinds.New(kind, settings, deps)
			if err == nil {
				err = p.dispatch.Set(kind+":"+name, s, p.cfg.delivery(kind))
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("channels.%s.%s: %w", kind, name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// route is the engine's Router: channels and zone from the policy in force
// (or the defaults without one), plus the operator channels, and the
// alerter's own per-tenant settings.
func (p *pipeline) route(tenant string) engine.Route {
	r := p.routes[tenant] // a copy; Silences is shared read-only
	var channels []string
	if p.watcher != nil {
		t := p.watcher.Current().Tenant(tenant)
		channels = t.Channels
		if t.Location != nil {
			r.Location = t.Location
		}
	} else {
		channels = p.cfg.DefaultChannels
	}
	r.Channels = slices.Clone(channels)
	for _, ch := range p.cfg.OperatorChannels {
		if !slices.Contains(r.Channels, ch) {
			r.Channels = append(r.Channels, ch)
		}
	}
	if r.Language == "" {
		r.Language = p.cfg.Language
	}
	return r
}

// consume feeds records to the engine until ctx ends.
func (p *pipeline) consume(ctx context.Context, cl *kgo.Client) {
	// Every poll holds rebalances (BlockRebalanceOnPoll) until
	// AllowRebalance, the last one included: leaving the group at Close
	// would wait forever.
	defer cl.AllowRebalance()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, part int32, err error) {
			p.log.Warn("signals fetch failed; retrying", "topic", topic, "partition", part, "err", err)
		})
		now := time.Now()
		fetches.EachRecord(func(r *kgo.Record) {
			p.handle(r, now)
			p.offMu.Lock()
			p.handled[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
			p.offMu.Unlock()
		})
		cl.AllowRebalance()
	}
}

// handle decodes one record and applies it. Bad records are counted and
// skipped: a poison signal must not stop alerting for everyone.
func (p *pipeline) handle(r *kgo.Record, now time.Time) {
	if err := p.auth.Verify(r); err != nil {
		p.unauthentic.Inc()
		if n := p.unauthenticN.Add(1); n <= 10 || n%1000 == 0 {
			p.log.Warn("refusing an unauthenticated signal", "reason", signalauth.Reason(err),
				"partition", r.Partition, "offset", r.Offset, "refused_so_far", n)
		}
		return
	}
	for _, h := range r.Headers {
		if h.Key == schemas.HeaderSchema && string(h.Value) != schemas.SchemaSignalsV1 {
			p.reject(r, fmt.Errorf("schema header %q is not %s", h.Value, schemas.SchemaSignalsV1))
			return
		}
	}
	var sig schemas.Signal
	if err := schemas.DecodeSignal(r.Value, &sig); err != nil {
		p.reject(r, err)
		return
	}
	p.signals.WithLabelValues(string(sig.Kind)).Inc()
	p.rememberPartition(sig.Tenant, r.Partition)
	p.engine.Observe(&sig, now)
}

func (p *pipeline) reject(r *kgo.Record, err error) {
	p.invalid.Inc()
	// The first few and then every thousandth: a stream of bad records
	// must not bury the log.
	if n := p.invalidCount.Add(1); n <= 10 || n%1000 == 0 {
		p.log.Warn("signal skipped", "partition", r.Partition, "offset", r.Offset, "skipped_so_far", n, "err", err)
	}
}

// forget drops the alerts of tenants on partitions this replica lost, and
// their offsets: the new owner commits them.
func (p *pipeline) forget(parts []int32) {
	if len(parts) == 0 {
		return
	}
	p.offMu.Lock()
	for _, part := range parts {
		delete(p.handled, part)
		delete(p.committed, part)
	}
	p.offMu.Unlock()
	if p.store != nil {
		p.store.forget(parts)
	}
	p.partMu.Lock()
	lost := map[string]bool{}
	for t, part := range p.tenantPart {
		if slices.Contains(parts, part) {
			lost[t] = true
			delete(p.tenantPart, t)
		}
	}
	p.partMu.Unlock()
	p.engine.Forget(func(tenant string) bool { return !lost[tenant] })
}

func (p *pipeline) registerMetrics(reg prometheus.Registerer) error {
	p.signals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_alerter_signals_total",
		Help: "Signals applied, by kind."}, []string{"kind"})
	p.invalid = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_signals_invalid_total",
		Help: "Records skipped because they are not valid signal v1."})
	p.unauthentic = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_signals_unauthenticated_total",
		Help: "Signal records refused because they are unsigned or badly signed (signal_auth)."})
	stat := func(f func(engine.Stats) float64) func() float64 {
		return func() float64 { return f(p.engine.Stats()) }
	}
	p.stateWrites = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_state_writes_total",
		Help: "Records written to the state topic: alert states and held notifications, deletions included."})
	p.stateFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_state_write_failures_total",
		Help: "Failed writes of alert states; offsets stay uncommitted until one succeeds."})
	p.stateRestored = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_state_restored_total",
		Help: "Alert states loaded from the state topic at start and on partition assignment."})
	p.stateRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_state_unauthenticated_total",
		Help: "State topic records refused on load because they are unsigned or badly signed (signal_auth); their alert keeps its last authentic state."})
	p.stateUnsigned = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_state_unsigned_total",
		Help: "Unsigned state topic records used on load under signal_auth.accept_unsigned_state (a migration)."})
	p.commitFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_offset_commit_failures_total",
		Help: "Failed commits of signal offsets."})
	p.partitionsPruned = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_alerter_tenant_partitions_pruned_total",
		Help: "Tenants whose signals partition was forgotten because the alerter held no alert state of them (a bound under tenant churn)."})
	cs := []prometheus.Collector{p.signals, p.partitionsPruned, p.invalid, p.unauthentic, p.stateWrites, p.stateFailures, p.stateRestored, p.stateRefused, p.stateUnsigned, p.commitFailures,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_alerter_alerts", Help: "Alerts tracked, by state.",
			ConstLabels: prometheus.Labels{"state": "pending"}}, stat(func(s engine.Stats) float64 { return float64(s.Pending) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_alerter_alerts", Help: "Alerts tracked, by state.",
			ConstLabels: prometheus.Labels{"state": "firing"}}, stat(func(s engine.Stats) float64 { return float64(s.Firing) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_alerter_signals_duplicate_total",
			Help: "Replayed signal IDs ignored."}, stat(func(s engine.Stats) float64 { return float64(s.DuplicateSignals) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_alerter_alerts_dropped_total",
			Help: "Signals for new alerts refused because rules.max_alerts were tracked."}, stat(func(s engine.Stats) float64 { return float64(s.DroppedNewAlerts) })),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("alerter metrics: %w", err)
		}
	}
	return nil
}

// RegisterMetrics registers the alerter's collectors (its own and its
// dispatcher's) on reg as Run does, unconnected (they read zero): for what
// lists the series a Sluice process exports, such as the check of
// deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error {
	if _, err := notify.NewMetrics(reg); err != nil {
		return err
	}
	p := &pipeline{}
	var err error
	if p.engine, err = engine.New(engine.DefaultConfig(), func(string) engine.Route { return engine.Route{} }, p); err != nil {
		return err
	}
	return p.registerMetrics(reg)
}

// minPartitionPrune is the size below which the tenants' partitions are
// never pruned (see rememberPartition).
const minPartitionPrune = 1024

// rememberPartition records the signals partition of tenant, where its
// alert state is written. The map would otherwise keep every tenant that
// ever sent a signal. Policy: it holds the tenants the engine holds state
// of (Engine.Tenants, which rules.max_alerts bounds) plus those seen since
// the last prune; when it reaches twice the size the last prune left (at
// least minPartitionPrune), the tenants the engine holds nothing of are
// dropped — a later signal of theirs records them again before the engine
// sees it. So its size stays under 2 × max(tenants with state,
// minPartitionPrune / 2) and nothing is refused.
func (p *pipeline) rememberPartition(tenant string, part int32) {
	p.partMu.Lock()
	p.tenantPart[tenant] = part
	full := len(p.tenantPart) >= max(p.partPruneAt, minPartitionPrune)
	p.partMu.Unlock()
	if full {
		p.prunePartitions()
	}
}

// prunePartitions drops the partitions of tenants the engine holds nothing
// of. It runs under persistMu, so that a save in progress, whose changes
// TakeDirty already took from the engine, never loses its tenants'
// partitions; when a save is in progress it leaves the pruning to the
// next signal.
func (p *pipeline) prunePartitions() {
	if !p.persistMu.TryLock() {
		return
	}
	defer p.persistMu.Unlock()
	keep := p.engine.Tenants()
	p.partMu.Lock()
	defer p.partMu.Unlock()
	before := len(p.tenantPart)
	for t := range p.tenantPart {
		if _, ok := keep[t]; !ok {
			delete(p.tenantPart, t)
		}
	}
	p.partPruneAt = 2 * len(p.tenantPart)
	p.partitionsPruned.Add(float64(before - len(p.tenantPart)))
}
