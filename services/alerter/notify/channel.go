package notify

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// channel is one destination's queue and worker.
type channel struct {
	name    string
	log     *slog.Logger
	metrics *Metrics
	queue   *ring
	wake    chan struct{}
	// conf is swapped whole when the policy changes the channel.
	conf atomic.Pointer[channelConf]
}

type channelConf struct {
	sender Sender
	cfg    ChannelConfig
	bucket *bucket
}

func (c *channel) setSender(s Sender, cfg ChannelConfig) {
	if old := c.conf.Load(); old != nil && old.cfg.RatePerMinute == cfg.RatePerMinute && old.cfg.Burst == cfg.Burst {
		// Keep the bucket's state: a policy reload must not refill it.
		c.conf.Store(&channelConf{sender: s, cfg: cfg, bucket: old.bucket})
		return
	}
	c.conf.Store(&channelConf{sender: s, cfg: cfg, bucket: newBucket(cfg.RatePerMinute/60, cfg.Burst)})
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
		if err := conf.bucket.wait(life); err != nil {
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

// bucket is a token bucket: rate tokens per second, at most burst saved.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(perSecond float64, burst int) *bucket {
	return &bucket{rate: perSecond, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// reserve takes a token and returns how long to wait before using it.
func (b *bucket) reserve(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

func (b *bucket) wait(ctx context.Context) error {
	d := b.reserve(time.Now())
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
