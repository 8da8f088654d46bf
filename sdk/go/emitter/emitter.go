// Package emitter sends a gateway's usage events to Sluice in the
// background: Emit never blocks the request path, events are batched, a
// failed batch is retried with exponential back-off and full jitter, and
// Flush and Close deliver what is buffered.
//
// Memory is bounded by MaxBufferedEvents and MaxBufferedBytes, counting both
// events waiting and the batch being sent. When the buffer is full, Emit
// drops the new event (drop newest) and returns ErrBufferFull: blocking
// would stall the gateway's requests behind Sluice, which the design rules
// out, and dropping the oldest would punish events that were already
// waiting longest through the outage. Every dropped event is counted in
// sluice_emitter_dropped_events_total{reason} and logged (one line per
// second at most, with the count), never silently.
//
// Events reach Sluice through a Sender: HTTPSender posts batches to the
// ingest API; KafkaSender produces them straight to the usage topic for
// gateways that can reach the brokers.
package emitter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/schemas"
)

// Sender delivers one batch of valid events.
//
// It returns the events the receiver refused for good (they are dropped and
// counted) and nil when every other event was acknowledged. A *RetryError
// asks for the batch, or the part it names, to be sent again; a
// *PermanentError, or any other error, is treated as described on them.
type Sender interface {
	Send(ctx context.Context, events []schemas.UsageEvent) (rejected []Rejection, err error)
}

// Rejection is an event the receiver refused and will refuse again.
type Rejection struct {
	// Index is the event's position in the batch.
	Index int
	// Reason says why.
	Reason string
}

// RetryError means some events were not acknowledged and may be sent again.
type RetryError struct {
	// Err is the cause.
	Err error
	// Indexes lists the events to resend; nil means every event of the
	// batch that was not rejected.
	Indexes []int
	// After is the receiver's requested delay (Retry-After), if any.
	After time.Duration
}

func (e *RetryError) Error() string { return "retryable: " + e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }

// PermanentError means the batch can never be delivered as it is (the
// receiver refuses its size or format): its events are dropped and counted.
// Any error that is neither a RetryError nor a PermanentError is retried.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// TooLargeError means the receiver refused the batch for its size (HTTP
// 413): the events themselves are fine. The Emitter splits the batch in
// halves and sends each on its own, down to single events; only an event
// refused on its own is dropped (counted as too_large). Dropping the whole
// batch, as a PermanentError does, would lose hundreds of valid events
// because the batch as a whole crossed a byte limit.
type TooLargeError struct{ Err error }

func (e *TooLargeError) Error() string { return "too large: " + e.Err.Error() }
func (e *TooLargeError) Unwrap() error { return e.Err }

// Errors Emit returns.
var (
	// ErrBufferFull means the event was dropped because the buffer is full.
	ErrBufferFull = errors.New("emitter: buffer full; event dropped (counted in sluice_emitter_dropped_events_total)")
	// ErrClosed means Close was called.
	ErrClosed = errors.New("emitter: closed")
)

// Config tunes an Emitter; zero fields take the defaults of DefaultConfig.
type Config struct {
	// MaxBufferedEvents bounds the events held, in-flight batch included.
	MaxBufferedEvents int
	// MaxBufferedBytes bounds their estimated encoded size.
	MaxBufferedBytes int64
	// BatchSize is the most events sent in one batch; keep it at or below
	// the ingest service's max_events_per_request.
	BatchSize int
	// FlushInterval is how long an event may wait for a batch to fill.
	FlushInterval time.Duration
	// SendTimeout bounds one attempt to send a batch.
	SendTimeout time.Duration
	// MinBackoff and MaxBackoff bound the retry delay: attempt n waits a
	// random time in [0, min(MaxBackoff, MinBackoff·2ⁿ)) (full jitter), so
	// a fleet of gateways does not retry in lock-step after an outage.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives drop and retry reports; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none are registered (they
	// are still counted, see Stats).
	Registerer prometheus.Registerer
}

// DefaultConfig holds up to 100,000 events or 64 MiB, sends batches of up
// to 1,000 events at least every 200ms, and backs off from 100ms to 30s.
func DefaultConfig() Config {
	return Config{
		MaxBufferedEvents: 100_000,
		MaxBufferedBytes:  64 << 20,
		BatchSize:         1000,
		FlushInterval:     200 * time.Millisecond,
		SendTimeout:       30 * time.Second,
		MinBackoff:        100 * time.Millisecond,
		MaxBackoff:        30 * time.Second,
	}
}

func (c *Config) fill() error {
	d := DefaultConfig()
	c.MaxBufferedEvents = cmp.Or(c.MaxBufferedEvents, d.MaxBufferedEvents)
	c.MaxBufferedBytes = cmp.Or(c.MaxBufferedBytes, d.MaxBufferedBytes)
	c.BatchSize = cmp.Or(c.BatchSize, d.BatchSize)
	c.FlushInterval = cmp.Or(c.FlushInterval, d.FlushInterval)
	c.SendTimeout = cmp.Or(c.SendTimeout, d.SendTimeout)
	c.MinBackoff = cmp.Or(c.MinBackoff, d.MinBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, d.MaxBackoff)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	var errs []error
	if c.MaxBufferedEvents < 1 {
		errs = append(errs, fmt.Errorf("emitter: MaxBufferedEvents %d must be at least 1", c.MaxBufferedEvents))
	}
	if c.BatchSize < 1 || c.BatchSize > c.MaxBufferedEvents {
		errs = append(errs, fmt.Errorf("emitter: BatchSize %d is outside 1..MaxBufferedEvents (%d)", c.BatchSize, c.MaxBufferedEvents))
	}
	if c.MaxBufferedBytes < 4096 {
		errs = append(errs, fmt.Errorf("emitter: MaxBufferedBytes %d is below the minimum 4096", c.MaxBufferedBytes))
	}
	if c.FlushInterval < 0 || c.SendTimeout < 0 || c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff {
		errs = append(errs, errors.New("emitter: durations must be positive and MaxBackoff at least MinBackoff"))
	}
	return errors.Join(errs...)
}

// Emitter buffers events and delivers them in the background. It is safe
// for concurrent use.
type Emitter struct {
	cfg    Config
	sender Sender
	m      *metrics

	mu       sync.Mutex
	queue    []entry // waiting events; queue[0] is the oldest
	bytes    int64   // estimated size of queue plus the in-flight batch
	inflight int     // events in the batch being sent
	emitted  uint64  // events accepted by Emit, ever
	settled  uint64  // events delivered or dropped after acceptance, ever
	closed   bool
	changed  chan struct{} // closed and replaced whenever settled grows
	dropLog  dropLog

	wake     chan struct{} // a batch is full or a flush is wanted
	stop     context.CancelFunc
	loopDone chan struct{}
}

type entry struct {
	ev   schemas.UsageEvent
	size int64
}

// New starts an emitter that delivers through sender.
func New(sender Sender, cfg Config) (*Emitter, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	e := &Emitter{
		cfg:      cfg,
		sender:   sender,
		m:        newMetrics(),
		changed:  make(chan struct{}),
		wake:     make(chan struct{}, 1),
		loopDone: make(chan struct{}),
	}
	e.m.setBuffered = func() float64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		return float64(len(e.queue) + e.inflight)
	}
	if cfg.Registerer != nil {
		if err := e.m.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("emitter: register metrics: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	go e.loop(ctx)
	return e, nil
}

// Emit validates ev and buffers a copy for delivery. It never blocks. It
// returns a schemas.ValidationError for an invalid event, ErrBufferFull when
// the event was dropped because the buffer is full, and ErrClosed after
// Close. The event's Attributes map is shared, not copied: do not change it
// after Emit.
func (e *Emitter) Emit(ev *schemas.UsageEvent) error {
	if err := ev.Validate(); err != nil {
		e.m.dropped.WithLabelValues("invalid").Inc()
		return err
	}
	size := estimate(ev)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if len(e.queue)+e.inflight >= e.cfg.MaxBufferedEvents || e.bytes+size > e.cfg.MaxBufferedBytes {
		e.dropLog.add(e.cfg.Logger, 1, "buffer_full")
		e.mu.Unlock()
		e.m.dropped.WithLabelValues("buffer_full").Inc()
		return ErrBufferFull
	}
	e.queue = append(e.queue, entry{ev: *ev, size: size})
	e.bytes += size
	e.emitted++
	full := len(e.queue) >= e.cfg.BatchSize
	e.mu.Unlock()
	e.m.emitted.Inc()
	if full {
		e.poke()
	}
	return nil
}

// Flush sends everything buffered now and waits until it was delivered (or
// dropped as rejected), or ctx ends. It keeps retrying through an outage
// until ctx ends; events still undelivered then stay buffered.
func (e *Emitter) Flush(ctx context.Context) error {
	e.mu.Lock()
	target := e.emitted
	e.mu.Unlock()
	for {
		e.mu.Lock()
		settled, ch, left := e.settled, e.changed, int(e.emitted-e.settled)
		e.mu.Unlock()
		if settled >= target {
			return nil
		}
		e.poke()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("emitter: flush: %d events not yet delivered: %w", left, ctx.Err())
		}
	}
}

// Close stops accepting events, delivers what is buffered within ctx, then
// stops. Events still undelivered when ctx ends are dropped, counted under
// reason "closed" and logged, and Close returns an error saying how many.
func (e *Emitter) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.loopDone
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	ferr := e.Flush(ctx)
	e.stop()
	<-e.loopDone
	e.mu.Lock()
	lost := len(e.queue)
	e.settled += uint64(lost)
	e.queue, e.bytes = nil, 0
	e.mu.Unlock()
	if e.cfg.Registerer != nil {
		e.m.unregister(e.cfg.Registerer)
	}
	if lost > 0 {
		e.m.dropped.WithLabelValues("closed").Add(float64(lost))
		e.cfg.Logger.Error("emitter closed with undelivered usage events; they are lost", "events", lost, "err", ferr)
		return fmt.Errorf("emitter: close: %d events were not delivered: %w", lost, ferr)
	}
	return nil
}

func (e *Emitter) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// loop sends one batch at a time: a batch is sent when BatchSize events are
// waiting, when FlushInterval passed, or when a flush asks.
func (e *Emitter) loop(ctx context.Context) {
	defer close(e.loopDone)
	tick := time.NewTicker(e.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-tick.C:
		}
		for {
			batch := e.take()
			if len(batch) == 0 {
				break
			}
			e.deliver(ctx, batch)
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// take moves up to BatchSize events from the queue into the in-flight
// batch. Their bytes stay counted until they settle.
func (e *Emitter) take() []entry {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := min(len(e.queue), e.cfg.BatchSize)
	if n == 0 {
		return nil
	}
	batch := make([]entry, n)
	copy(batch, e.queue)
	clear(e.queue[:n])
	e.queue = e.queue[n:]
	if len(e.queue) == 0 {
		e.queue = e.queue[:0:0] // let the backing array go
	}
	e.inflight = n
	return batch
}

// deliver sends batch until every event was acknowledged or rejected,
// backing off between attempts. If ctx ends first (Close's deadline), the
// events left go back to the front of the queue for Close to count.
func (e *Emitter) deliver(ctx context.Context, batch []entry) {
	events := make([]schemas.UsageEvent, len(batch))
	for i := range batch {
		events[i] = batch[i].ev
	}
	pending := batch
	for attempt := 0; ; attempt++ {
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, e.cfg.SendTimeout)
		rejected, err := e.sender.Send(sctx, events)
		cancel()
		e.m.sendSeconds.Observe(time.Since(start).Seconds())
		if len(rejected) > 0 {
			e.m.dropped.WithLabelValues("rejected").Add(float64(len(rejected)))
			e.cfg.Logger.Error("Sluice rejected usage events; they are dropped", "events", len(rejected), "first_reason", rejected[0].Reason)
		}
		var re *RetryError
		var pe *PermanentError
		var tl *TooLargeError
		switch {
		case err == nil:
			e.m.delivered.Add(float64(len(pending) - len(rejected)))
			e.settle(pending)
			return
		case errors.As(err, &tl) && len(pending) > 1:
			// Each half is delivered (or split again) on its own; depth is
			// log2 of the batch size.
			half := len(pending) / 2
			e.m.splits.Inc()
			e.cfg.Logger.Warn("Sluice refused a batch of usage events as too large; sending it in halves",
				"events", len(pending), "halves", []int{half, len(pending) - half}, "err", err)
			e.deliver(ctx, pending[:half:half])
			if ctx.Err() != nil {
				e.requeue(pending[half:])
				return
			}
			e.deliver(ctx, pending[half:])
			return
		case errors.As(err, &tl):
			e.m.dropped.WithLabelValues("too_large").Add(float64(len(pending)))
			e.cfg.Logger.Error("Sluice refused a single usage event as too large; it is dropped", "id", pending[0].ev.ID, "err", err)
			e.settle(pending)
			return
		case errors.As(err, &pe):
			left := len(pending) - len(rejected)
			e.m.dropped.WithLabelValues("refused").Add(float64(left))
			e.cfg.Logger.Error("Sluice refused a batch of usage events; they are dropped", "events", left, "err", err)
			e.settle(pending)
			return
		}
		after := time.Duration(0)
		retry := pending
		if errors.As(err, &re) {
			after = re.After
			if re.Indexes != nil {
				retry = make([]entry, 0, len(re.Indexes))
				for _, i := range re.Indexes {
					retry = append(retry, pending[i])
				}
			}
		}
		if len(rejected) > 0 && (re == nil || re.Indexes == nil) {
			skip := make(map[int]bool, len(rejected))
			for _, r := range rejected {
				skip[r.Index] = true
			}
			kept := retry[:0:0]
			for i, en := range retry {
				if !skip[i] {
					kept = append(kept, en)
				}
			}
			retry = kept
		}
		done := len(pending) - len(retry)
		if ok := done - len(rejected); ok > 0 {
			e.m.delivered.Add(float64(ok))
		}
		e.settleSome(len(pending)-len(retry), sizeOf(pending)-sizeOf(retry))
		pending = retry
		events = events[:0]
		for i := range pending {
			events = append(events, pending[i].ev)
		}
		e.m.retries.Inc()
		wait := backoff(attempt, e.cfg.MinBackoff, e.cfg.MaxBackoff)
		wait = max(wait, after)
		e.cfg.Logger.Warn("sending usage events failed; retrying", "events", len(pending), "attempt", attempt+1, "in", wait.String(), "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			e.requeue(pending)
			return
		}
	}
}

// backoff is full jitter: uniform in [0, min(max, min·2ⁿ)).
func backoff(attempt int, lo, hi time.Duration) time.Duration {
	ceil := hi
	if attempt < 32 {
		if c := lo << attempt; c > 0 && c < hi {
			ceil = c
		}
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil)
}

func sizeOf(es []entry) (n int64) {
	for i := range es {
		n += es[i].size
	}
	return n
}

func (e *Emitter) settle(batch []entry) { e.settleSome(len(batch), sizeOf(batch)) }

func (e *Emitter) settleSome(n int, bytes int64) {
	if n == 0 {
		return
	}
	e.mu.Lock()
	e.settled += uint64(n)
	e.inflight -= n
	e.bytes -= bytes
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
}

func (e *Emitter) requeue(pending []entry) {
	e.mu.Lock()
	e.queue = append(pending, e.queue...)
	e.inflight = 0
	e.mu.Unlock()
}

// estimate is an upper-bound guess of an event's encoded size, cheap
// enough for the request path.
func estimate(ev *schemas.UsageEvent) int64 {
	n := 220 + len(ev.ID) + len(ev.Tenant) + len(ev.Model) + len(ev.User) + len(ev.APIKeyID) +
		len(ev.Provider) + len(ev.Endpoint) + len(ev.SessionID) + len(ev.Gateway) + len(ev.RequestedModel)
	for k, v := range ev.Attributes {
		n += len(k) + len(v) + 6
	}
	return int64(n)
}

// dropLog reports drops at most once per second with their count.
type dropLog struct {
	last    time.Time
	pending int
}

func (d *dropLog) add(log *slog.Logger, n int, reason string) {
	d.pending += n
	if now := time.Now(); now.Sub(d.last) >= time.Second {
		log.Error("emitter buffer full: dropping usage events (policy: drop newest)", "dropped", d.pending, "reason", reason)
		d.last, d.pending = now, 0
	}
}
