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

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alertmanager"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/engine"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Run consumes signals and notifies until ctx is cancelled, then stops
// consuming, flushes the alerts held for grouping and sends what is queued
// within cfg.ShutdownDrain. Its loops share one errgroup: the first that
// fails stops the others, and Run returns that error.
func Run(ctx context.Context, cfg Config, env platform.Env) error {
	env = env.Named("alerter")
	var watcher *policy.Watcher
	if cfg.PolicyFile != "" {
		var err error
		// The channel kinds check the policy's channel definitions, so a
		// bad one fails the load (or keeps the previous policy on reload).
		if watcher, err = policy.NewWatcher(cfg.PolicyFile, cfg.PolicyReload, env.Logger,
			policy.WithChannelCheck(channelKinds.Check)); err != nil {
			return fmt.Errorf("alerter.policy_file: %w", err)
		}
	}
	p, err := newPipeline(cfg, env, watcher)
	if err != nil {
		return err
	}
	cl, err := kafkaconn.NewClient(env.Kafka,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.DisableAutoCommit(), // state is rebuilt by replay; see the package doc
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) { p.forget(lost[cfg.Topic]) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) { p.forget(lost[cfg.Topic]) }),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, cl, env.Kafka, cfg.Topic); err != nil {
		return err
	}
	env.Health.AddReadiness("alerter-kafka", kafkaconn.Ready(cl))
	defer env.Health.RemoveReadiness("alerter-kafka")

	env.Logger.Info("alerter running", "topic", cfg.Topic, "group", cfg.Group, "channels", p.dispatch.Channels())
	g, ctx := errgroup.WithContext(ctx)
	// The dispatcher outlives ctx: it drains its queues for
	// cfg.ShutdownDrain once the tick loop, the engine's only deliverer, has
	// flushed what it held for grouping. Its context is ctx's values without
	// ctx's cancellation; runTicks cancels it.
	dctx, stopDispatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDispatch()
	g.Go(func() error { return p.dispatch.Run(dctx, cfg.ShutdownDrain) })
	g.Go(func() error {
		defer stopDispatch()
		p.runTicks(ctx, cfg.Tick)
		return nil
	})
	g.Go(func() error { p.consume(ctx, cl); return nil })
	if watcher != nil {
		g.Go(func() error { return watcher.Follow(ctx, p.applyPolicy) })
	}
	err = g.Wait()
	env.Logger.Info("alerter stopped")
	return err
}

// runTicks advances the engine every tick until ctx ends, then flushes the
// alerts held for grouping, so that nothing is lost at shutdown. Only Tick
// and Flush deliver, so once runTicks returns nothing more reaches the
// dispatcher.
func (p *pipeline) runTicks(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.engine.Flush(time.Now())
			return
		case now := <-t.C:
			p.engine.Tick(now)
		}
	}
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
	cfg      Config
	log      *slog.Logger
	watcher  *policy.Watcher
	render   *message.Renderer
	dispatch *notify.Dispatcher
	metrics  *notify.Metrics
	engine   *engine.Engine
	routes   map[string]engine.Route
	client   *http.Client

	signals      *prometheus.CounterVec
	invalid      prometheus.Counter
	invalidCount atomic.Int64

	partMu     sync.Mutex
	tenantPart map[string]int32
}

func newPipeline(cfg Config, env platform.Env, watcher *policy.Watcher) (*pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	render, err := message.New(cfg.Language, cfg.TemplatesDir, cfg.Links, cfg.IncidentListMax)
	if err != nil {
		return nil, fmt.Errorf("alerter.templates_dir: %w", err)
	}
	nm, err := notify.NewMetrics(env.Metrics)
	if err != nil {
		return nil, err
	}
	p := &pipeline{
		cfg: cfg, log: env.Logger, watcher: watcher, render: render,
		dispatch:   notify.NewDispatcher(env.Logger, nm),
		metrics:    nm,
		routes:     map[string]engine.Route{},
		client:     &http.Client{},
		tenantPart: map[string]int32{},
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
	if p.engine, err = engine.New(cfg.Rules, p.route, p.dispatch); err != nil {
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
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, part int32, err error) {
			p.log.Warn("signals fetch failed; retrying", "topic", topic, "partition", part, "err", err)
		})
		now := time.Now()
		fetches.EachRecord(func(r *kgo.Record) { p.handle(r, now) })
	}
}

// handle decodes one record and applies it. Bad records are counted and
// skipped: a poison signal must not stop alerting for everyone.
func (p *pipeline) handle(r *kgo.Record, now time.Time) {
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
	p.partMu.Lock()
	p.tenantPart[sig.Tenant] = r.Partition
	p.partMu.Unlock()
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

// forget drops the alerts of tenants on partitions this replica lost.
func (p *pipeline) forget(parts []int32) {
	if len(parts) == 0 {
		return
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
	stat := func(f func(engine.Stats) float64) func() float64 {
		return func() float64 { return f(p.engine.Stats()) }
	}
	cs := []prometheus.Collector{p.signals, p.invalid,
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
