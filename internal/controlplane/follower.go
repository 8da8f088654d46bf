package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
)

// Follower keeps a Log current from the admin topic for a process that
// only reads it (a gateway: its keys, and the tenants and plans laid over
// its policy): it reads the whole topic from its start,
// outside any consumer group, since every reader needs every record.
type Follower struct {
	cl       *kgo.Client
	topic    string
	log      *Log
	logger   *slog.Logger
	onChange func()
	refused  atomic.Int64
	records  *prometheus.CounterVec
}

// NewFollower returns a follower of topic (created compacted if missing)
// verifying with auth. onChange is called after every poll that applied a
// record, from the follower's goroutine.
func NewFollower(ctx context.Context, kc kafkaconn.Config, topic string, auth *signalauth.Auth, logger *slog.Logger, onChange func()) (*Follower, error) {
	cl, err := kafkaconn.NewClient(kc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	if err := kafkaconn.EnsureCompactedTopic(ctx, cl, kc, topic); err != nil {
		cl.Close()
		return nil, err
	}
	return &Follower{cl: cl, topic: topic, log: NewLog(auth), logger: logger, onChange: onChange,
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_controlplane_records_total",
			Help: "Control-plane records (API keys, tenants, plans) of the admin topic read by this process, by result (applied; stale, unauthenticated, invalid: refused; ignored: operator actions and tombstones)."},
			[]string{"result"})}, nil
}

// Log returns the follower's log.
func (f *Follower) Log() *Log { return f.log }

// Collector is the follower's metric, for the host to register.
func (f *Follower) Collector() prometheus.Collector { return f.records }

// CatchUp applies the records the topic holds now, then calls onChange
// once: a process that serves only after it returns knows every key issued
// before it started.
func (f *Follower) CatchUp(ctx context.Context) error {
	if err := kafkaconn.ReadToEnd(ctx, f.cl, f.topic, func(r *kgo.Record) { f.apply(r) }); err != nil {
		return err
	}
	if f.onChange != nil {
		f.onChange()
	}
	return nil
}

// Run applies the topic's records as they come until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		fs := f.cl.PollFetches(ctx)
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				f.logger.Warn("control plane: admin topic fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		changed := false
		fs.EachRecord(func(r *kgo.Record) { changed = f.apply(r) || changed })
		if changed && f.onChange != nil {
			f.onChange()
		}
	}
	return nil
}

// apply folds r into the log and reports whether it changed anything.
func (f *Follower) apply(r *kgo.Record) bool {
	res := f.log.Apply(r)
	f.records.WithLabelValues(string(res.Outcome)).Inc()
	switch res.Outcome {
	case Applied:
		return true
	case Stale, Unauthenticated, Invalid:
		// The first ten, then every thousandth: a flood of forgeries must
		// not bury the log.
		if n := f.refused.Add(1); n <= 10 || n%1000 == 0 {
			f.logger.Warn("control plane: refusing a record; its key stays as it was", "result", res.Outcome,
				"err", res.Err, "offset", r.Offset, "refused_so_far", n)
		}
	}
	return false
}

// Close releases the Kafka client.
func (f *Follower) Close() { f.cl.Close() }

// FollowPolicy makes a follower of the admin topic (env.Topics.Admin) that
// lays the topic's tenants and plans over pw after every change, calling
// onChange (when not nil) first; it registers the follower's record count
// (labelled with service, so that several followers share one process) and
// sluice_<service>_policy_conflicts on env.Metrics. The caller reads
// the topic with CatchUp, before it serves or after, as its failure modes
// want, then runs Run until it stops and calls stop once Run has returned.
func FollowPolicy(ctx context.Context, service string, env platform.Env, pw *policy.Watcher, onChange func()) (f *Follower, stop func(), err error) {
	if err := env.Topics.Check("admin"); err != nil {
		return nil, nil, err
	}
	log := env.Logger.With("component", "controlplane")
	auth, err := signalauth.Open(env.SignalAuth, log)
	if err != nil {
		return nil, nil, fmt.Errorf("signal_auth: %w", err)
	}
	f, err = NewFollower(ctx, env.Kafka, env.Topics.Admin, auth, log, func() {
		if onChange != nil {
			onChange()
		}
		pw.SetOverlay(f.Log().Overlay()) // a no-op unless a tenant or plan changed
	})
	if err != nil {
		return nil, nil, err
	}
	// The record count is one metric per process, its followers told apart
	// by service; the conflicts gauge is already named for its service.
	regs := []prometheus.Registerer{prometheus.WrapRegistererWith(prometheus.Labels{"service": service}, env.Metrics), env.Metrics}
	cs := []prometheus.Collector{f.Collector(), PolicyConflicts(service, pw)}
	for i, c := range cs {
		if err := regs[i].Register(c); err != nil {
			if i > 0 {
				regs[0].Unregister(cs[0])
			}
			f.Close()
			return nil, nil, fmt.Errorf("%s: metrics: %w", service, err)
		}
	}
	return f, func() {
		for i, c := range cs {
			regs[i].Unregister(c)
		}
		f.Close()
	}, nil
}
