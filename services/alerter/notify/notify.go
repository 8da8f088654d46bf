// Package notify delivers alert messages to channels. Every channel has its
// own bounded queue, worker, token-bucket rate limit (golang.org/x/time/rate)
// and retry with exponential back-off, so a failing or slow channel never
// delays the others. A full queue drops its oldest message (counted and logged): the
// newest state of an alert is the one worth sending.
package notify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// Sender delivers one message over one channel. It returns an error wrapped
// by Permanent when retrying cannot help (a 400, a bad webhook), and one
// made by RetryAfter when the receiver asked to wait.
type Sender interface {
	Send(ctx context.Context, m alert.Message) error
}

type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks err as not worth retrying.
func Permanent(err error) error { return permanentError{err} }

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (r retryAfterError) Error() string { return r.err.Error() }
func (r retryAfterError) Unwrap() error { return r.err }

// RetryAfter marks err as retryable no sooner than after, as a receiver's
// Retry-After header or rate-limit error code asks.
func RetryAfter(err error, after time.Duration) error { return retryAfterError{err, after} }

// ChannelConfig tunes one channel's delivery.
type ChannelConfig struct {
	// QueueSize bounds the messages waiting; when full the oldest is
	// dropped.
	QueueSize int `yaml:"queue_size" help:"messages waiting per channel; when full the oldest is dropped"`
	// RatePerMinute and Burst form the token bucket: DingTalk robots accept
	// 20 messages a minute, Slack webhooks about one a second.
	RatePerMinute float64 `yaml:"rate_per_minute" help:"messages per minute the channel may send"`
	Burst         int     `yaml:"burst" help:"messages the channel may send at once above its rate"`
	// MaxAttempts bounds the tries per message, the first included.
	MaxAttempts int `yaml:"max_attempts" help:"tries per message, the first included"`
	// InitialBackoff doubles per retry up to MaxBackoff, with jitter.
	InitialBackoff time.Duration `yaml:"initial_backoff" help:"wait before the first retry; doubles per retry"`
	MaxBackoff     time.Duration `yaml:"max_backoff" help:"longest wait between retries"`
	// Timeout bounds one attempt.
	Timeout time.Duration `yaml:"timeout" help:"time limit of one delivery attempt"`
}

// DefaultChannelConfig returns 1000 queued messages, 20 a minute with a
// burst of 5 (DingTalk's limit), 5 attempts from 1s to 30s apart, and a 10s
// attempt timeout.
func DefaultChannelConfig() ChannelConfig {
	return ChannelConfig{QueueSize: 1000, RatePerMinute: 20, Burst: 5, MaxAttempts: 5,
		InitialBackoff: time.Second, MaxBackoff: 30 * time.Second, Timeout: 10 * time.Second}
}

// Or returns c with every field left at zero taken from def, so that a
// configuration may set one field of a channel kind's defaults. No field
// has a meaningful zero: every one must be positive.
func (c ChannelConfig) Or(def ChannelConfig) ChannelConfig {
	return ChannelConfig{
		QueueSize:      cmp.Or(c.QueueSize, def.QueueSize),
		RatePerMinute:  cmp.Or(c.RatePerMinute, def.RatePerMinute),
		Burst:          cmp.Or(c.Burst, def.Burst),
		MaxAttempts:    cmp.Or(c.MaxAttempts, def.MaxAttempts),
		InitialBackoff: cmp.Or(c.InitialBackoff, def.InitialBackoff),
		MaxBackoff:     cmp.Or(c.MaxBackoff, def.MaxBackoff),
		Timeout:        cmp.Or(c.Timeout, def.Timeout),
	}
}

// Validate checks every field; prefix names the configuration section.
func (c ChannelConfig) Validate(prefix string) error {
	var errs []error
	if c.QueueSize < 1 || c.QueueSize > 1_000_000 {
		errs = append(errs, fmt.Errorf("%s.queue_size: %d is outside 1..1000000", prefix, c.QueueSize))
	}
	if c.RatePerMinute <= 0 {
		errs = append(errs, fmt.Errorf("%s.rate_per_minute: %g must be positive", prefix, c.RatePerMinute))
	}
	if c.Burst < 1 {
		errs = append(errs, fmt.Errorf("%s.burst: %d must be at least 1", prefix, c.Burst))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 100 {
		errs = append(errs, fmt.Errorf("%s.max_attempts: %d is outside 1..100", prefix, c.MaxAttempts))
	}
	if c.InitialBackoff <= 0 || c.MaxBackoff < c.InitialBackoff {
		errs = append(errs, fmt.Errorf("%s.initial_backoff, max_backoff: %v and %v must be positive with max_backoff at least initial_backoff", prefix, c.InitialBackoff, c.MaxBackoff))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("%s.timeout: %v must be positive", prefix, c.Timeout))
	}
	return errors.Join(errs...)
}

// Metrics are the dispatcher's collectors, labelled by channel.
type Metrics struct {
	Sent, Failed, Dropped, Retries *prometheus.CounterVec
	Queued                         *prometheus.GaugeVec
}

// NewMetrics registers the dispatcher's collectors on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_alerter_notifications_sent_total",
			Help: "Messages a channel accepted."}, []string{"channel"}),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_alerter_notifications_failed_total",
			Help: "Messages given up on after their last attempt or a permanent error."}, []string{"channel"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_alerter_notifications_dropped_total",
			Help: "Messages dropped unsent: the oldest of a full queue, or for a channel that is not configured."}, []string{"channel"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_alerter_notification_retries_total",
			Help: "Delivery attempts after a first failure."}, []string{"channel"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_alerter_notification_queue_length",
			Help: "Messages waiting per channel."}, []string{"channel"}),
	}
	for _, c := range []prometheus.Collector{m.Sent, m.Failed, m.Dropped, m.Retries, m.Queued} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("alerter metrics: %w", err)
		}
	}
	return m, nil
}

// Dispatcher owns the channels. Channels may be set before or while it
// runs, so a hot-reloaded policy can add a robot or rotate its secret.
type Dispatcher struct {
	log     *slog.Logger
	metrics *Metrics

	mu       sync.Mutex
	channels map[string]*channel
	// life is the workers' context once Run started; nil before.
	life    context.Context
	stop    chan struct{}
	workers sync.WaitGroup
}

// NewDispatcher returns a dispatcher without channels.
func NewDispatcher(log *slog.Logger, m *Metrics) *Dispatcher {
	return &Dispatcher{log: log, metrics: m, channels: map[string]*channel{}, stop: make(chan struct{})}
}

// Set registers channel name, or replaces the sender and settings of an
// existing one (its queue is kept). A channel set while the dispatcher runs
// starts its worker at once.
func (d *Dispatcher) Set(name string, s Sender, cfg ChannelConfig) error {
	if err := cfg.Validate("channel " + name); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.channels[name]; ok {
		c.setSender(s, cfg)
		return nil
	}
	c := newChannel(name, d.log, d.metrics, cfg)
	c.setSender(s, cfg)
	d.channels[name] = c
	d.metrics.Queued.WithLabelValues(name).Set(0)
	if d.life != nil {
		d.workers.Go(func() { c.work(d.life, d.stop) })
	}
	return nil
}

// Channels lists the registered channel names, sorted.
func (d *Dispatcher) Channels() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.channels))
	for n := range d.channels {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Deliver queues m for channel name without blocking. A message for an
// unknown channel is dropped, counted and logged, so that a typo in a
// tenant's policy costs that tenant's notice and nothing else.
func (d *Dispatcher) Deliver(name string, m alert.Message) {
	d.mu.Lock()
	c, ok := d.channels[name]
	d.mu.Unlock()
	if !ok {
		d.metrics.Dropped.WithLabelValues(name).Inc()
		d.log.Warn("alert for a channel that is not configured; dropped", "channel", name, "alerts", len(m.Alerts))
		return
	}
	c.enqueue(m)
}

// Run starts one worker per channel and returns when ctx is cancelled and
// the workers have drained their queues, or drain has passed, whichever
// comes first; what is still queued then is counted as dropped. Run may be
// called once.
func (d *Dispatcher) Run(ctx context.Context, drain time.Duration) error {
	// Workers send under life, not ctx, so that a shutdown finishes the
	// messages in flight and queued until the drain deadline.
	life, cancelLife := context.WithCancel(context.Background())
	defer cancelLife()
	d.mu.Lock()
	if d.life != nil {
		d.mu.Unlock()
		return errors.New("notify: Dispatcher.Run called twice")
	}
	d.life = life
	for _, c := range d.channels {
		d.workers.Go(func() { c.work(life, d.stop) })
	}
	d.mu.Unlock()
	<-ctx.Done()
	d.mu.Lock()
	close(d.stop)
	d.mu.Unlock()
	done := make(chan struct{})
	go func() { d.workers.Wait(); close(done) }()
	timer := time.NewTimer(drain)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		cancelLife()
		<-done
	}
	return nil
}
