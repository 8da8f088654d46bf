package notify

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// channel is one destination's queue and worker.
type channel struct {
	name    string
	log     *slog.Logger
	metrics *Metrics
	queue   *ring
	wake    chan struct{}
	// limiter is the channel's token bucket. It lives as long as the
	// channel: a policy reload that re-sets the channel adjusts its rate
	// and burst but must not refill it.
	limiter *rate.Limiter
	// conf is swapped whole when the policy changes the channel.
	conf atomic.Pointer[channelConf]
}

type channelConf struct {
	sender Sender
	cfg    ChannelConfig
}

func newChannel(name string, log *slog.Logger, m *Metrics, cfg ChannelConfig) *channel {
	return &channel{
		name: name, log: log.With("channel", name), metrics: m,
		queue:   newRing(cfg.QueueSize),
		wake:    make(chan struct{}, 1),
		limiter: rate.NewLimiter(perSecond(cfg), cfg.Burst),
	}
}

// perSecond is cfg's rate in the limiter's unit.
func perSecond(cfg ChannelConfig) rate.Limit { return rate.Limit(cfg.RatePerMinute / 60) }

func (c *channel) setSender(s Sender, cfg ChannelConfig) {
	if c.limiter.Limit() != perSecond(cfg) {
		c.limiter.SetLimit(perSecond(cfg))
	}
	if c.limiter.Burst() != cfg.Burst {
		c.limiter.SetBurst(cfg.Burst)
	}
	c.conf.Store(&channelConf{sender: s, cfg: cfg})
}

func (c *channel) enqueue(m alert.Message) {
	dropped, n := c.queue.push(m)
	c.metrics.Queued.WithLabelValues(c.name).Set(float64(n))
	if dropped != nil {
		c.metrics.Dropped.WithLabelValues(c.name).Inc()
		c.log.Warn("notification queue full; dropped the oldest message",
			"queue_size", c.queue.capacity(), "dropped_alerts", len(dropped.Alerts))
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// work sends queued messages until stop is closed and the queue is empty,
// or life is cancelled (the drain deadline), which drops what is left.
func (c *channel) work(life context.Context, stop <-chan struct{}) {
	for {
		m, ok, n := c.queue.pop()
		c.metrics.Queued.WithLabelValues(c.name).Set(float64(n))
		if !ok {
			select {
			case <-c.wake:
				continue
			case <-stop:
				if c.queue.len() == 0 {
					return
				}
				continue
			case <-life.Done():
				return
			}
		}
		if life.Err() != nil {
			c.metrics.Dropped.WithLabelValues(c.name).Add(float64(1 + c.queue.len()))
			c.log.Warn("shutdown deadline passed; notifications left unsent", "count", 1+c.queue.len())
			return
		}
		c.send(life, m)
	}
}

// send delivers m with rate limit and retries.
func (c *channel) send(life context.Context, m alert.Message) {
	conf := c.conf.Load()
	backoff := conf.cfg.InitialBackoff
	for attempt := 1; ; attempt++ {
		conf = c.conf.Load()
		if err := c.limiter.Wait(life); err != nil {
			c.metrics.Failed.WithLabelValues(c.name).Inc()
			return
		}
		ctx, cancel := context.WithTimeout(life, conf.cfg.Timeout)
		err := conf.sender.Send(ctx, m)
		cancel()
		if err == nil {
			c.metrics.Sent.WithLabelValues(c.name).Inc()
			return
		}
		if IsPermanent(err) || attempt >= conf.cfg.MaxAttempts || life.Err() != nil {
			c.metrics.Failed.WithLabelValues(c.name).Inc()
			c.log.Error("notification failed; giving up", "attempts", attempt, "alerts", len(m.Alerts), "err", err)
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1) // jitter spreads retries of many alerters
		if ra, ok := err.(retryAfterError); ok && ra.after > wait {
			wait = ra.after
		}
		c.log.Warn("notification failed; retrying", "attempt", attempt, "in", wait, "err", err)
		c.metrics.Retries.WithLabelValues(c.name).Inc()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-life.Done():
			t.Stop()
			c.metrics.Failed.WithLabelValues(c.name).Inc()
			return
		}
		backoff = min(backoff*2, conf.cfg.MaxBackoff)
	}
}

// ring is a bounded FIFO that drops its oldest element when full.
type ring struct {
	mu    sync.Mutex
	buf   []alert.Message
	head  int
	count int
}

func newRing(size int) *ring { return &ring{buf: make([]alert.Message, size)} }

// push appends m and returns the message it evicted, if any, and the new
// length.
func (r *ring) push(m alert.Message) (*alert.Message, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var dropped *alert.Message
	if r.count == len(r.buf) {
		old := r.buf[r.head]
		dropped = &old
		r.head = (r.head + 1) % len(r.buf)
		r.count--
	}
	r.buf[(r.head+r.count)%len(r.buf)] = m
	r.count++
	return dropped, r.count
}

func (r *ring) pop() (alert.Message, bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count == 0 {
		return alert.Message{}, false, 0
	}
	m := r.buf[r.head]
	r.buf[r.head] = alert.Message{}
	r.head = (r.head + 1) % len(r.buf)
	r.count--
	return m, true, r.count
}

func (r *ring) capacity() int { return len(r.buf) }

func (r *ring) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}
