package admission

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPrefix starts every Redis key of admission; see Layout in the
// package documentation.
const DefaultPrefix = "sluice:adm:"

// Defaults of the options.
const (
	DefaultMaxWait       = 5 * time.Millisecond
	DefaultLeaseFraction = 0.01
	DefaultLeaseHorizon  = 100 * time.Millisecond
	DefaultLeaseTTL      = time.Second
	DefaultRefusalCache  = 250 * time.Millisecond
	DefaultProbeInterval = 50 * time.Millisecond
	DefaultIdleTTL       = time.Minute
	DefaultMaxInstances  = 100_000
	DefaultMaxPending    = 100_000
	DefaultSettleTTL     = 10 * time.Minute
	DefaultMaxWaiters    = 1000
)

type options struct {
	prefix        string
	maxWait       time.Duration
	gateways      int
	leaseFraction float64
	leaseHorizon  time.Duration
	leaseTTL      time.Duration
	refusalCache  time.Duration
	probe         time.Duration
	idle          time.Duration
	maxInstances  int
	maxPending    int
	settleTTL     time.Duration
	maxWaiters    int
	reg           prometheus.Registerer
	log           *slog.Logger
	clock         func() time.Time
	// scriptClock, when set, is the time the scripts use instead of
	// Redis's TIME (WithScriptClock).
	scriptClock func() time.Time
	// onTick, when set, runs after every iteration of the background
	// loop: tests wait on it to know a probe and a flush have run, rather
	// than sleeping.
	onTick func()
}

func defaultOptions() options {
	return options{
		prefix:        DefaultPrefix,
		maxWait:       DefaultMaxWait,
		gateways:      1,
		leaseFraction: DefaultLeaseFraction,
		leaseHorizon:  DefaultLeaseHorizon,
		leaseTTL:      DefaultLeaseTTL,
		refusalCache:  DefaultRefusalCache,
		probe:         DefaultProbeInterval,
		idle:          DefaultIdleTTL,
		maxInstances:  DefaultMaxInstances,
		maxPending:    DefaultMaxPending,
		settleTTL:     DefaultSettleTTL,
		maxWaiters:    DefaultMaxWaiters,
		log:           slog.New(slog.DiscardHandler),
		clock:         time.Now,
	}
}

// Option adjusts a Limiter.
type Option func(*options)

// WithPrefix puts every key under prefix instead of DefaultPrefix, for a
// deployment (or a test) sharing its Redis.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithMaxWait bounds how long Admit (and Settle) wait for Redis (default
// 5 ms); past it the tenant's fail mode decides. It also bounds the probe
// that decides Redis is back.
func WithMaxWait(d time.Duration) Option { return func(o *options) { o.maxWait = d } }

// WithGatewayCount is how many gateways share the rules (default 1): while
// Redis is unreachable each one enforces every limit divided by it.
func WithGatewayCount(n int) Option { return func(o *options) { o.gateways = n } }

// WithLeaseFraction caps one gateway's lease on one rule instance at this
// fraction of the rule's limit (default 0.01); 0 runs every rule exact.
// The overshoot bound of a leased rule is gateways × fraction × limit.
func WithLeaseFraction(f float64) Option { return func(o *options) { o.leaseFraction = f } }

// WithLeaseHorizon sizes leases: a lease holds about this much of the
// instance's observed admission rate (default 100 ms), so a busy gateway
// asks Redis about once per horizon.
func WithLeaseHorizon(d time.Duration) Option { return func(o *options) { o.leaseHorizon = d } }

// WithLeaseTTL is how long a lease may be spent (default 1 s, and at most a
// quarter of a window); then its unused rest goes back to Redis.
func WithLeaseTTL(d time.Duration) Option { return func(o *options) { o.leaseTTL = d } }

// WithRefusalCache keeps a Redis refusal of a rule instance in memory for
// at most d (default 250 ms, never past its retry-after), refusing requests
// at least as large without a round trip; 0 disables it. It only refuses,
// so it never adds overshoot. A cached refusal repeats Redis's retry-after
// and available units, not the cache entry's shorter life.
func WithRefusalCache(d time.Duration) Option { return func(o *options) { o.refusalCache = d } }

// WithProbeInterval is how often an unreachable Redis is probed and pending
// corrections are flushed (default 50 ms).
func WithProbeInterval(d time.Duration) Option { return func(o *options) { o.probe = d } }

// WithIdleTTL forgets rule instances (and their request shapes) unused for
// d (default 1 min), returning their leases first.
func WithIdleTTL(d time.Duration) Option { return func(o *options) { o.idle = d } }

// WithMaxInstances bounds the rule instances and request shapes kept in
// memory (default 100,000 each). Beyond it, requests are still decided by
// Redis, without leases, and while Redis is unreachable their local limit
// does not persist from one request to the next (their debits are still
// reconciled).
func WithMaxInstances(n int) Option { return func(o *options) { o.maxInstances = n } }

// WithMaxPending bounds the corrections waiting for Redis (settlements,
// lease rests, local debits; default 100,000 entries, merged per rule
// instance). When it is full a new correction is dropped and counted in
// sluice_admission_reconcile_dropped_total; Settle returns ErrBacklogFull
// so its caller may retry.
func WithMaxPending(n int) Option { return func(o *options) { o.maxPending = n } }

// WithSettleTTL is how long Redis remembers that a settlement or a batch
// of corrections was applied (default 10 min; the life of their marker
// keys): a retry within it is not applied twice.
func WithSettleTTL(d time.Duration) Option { return func(o *options) { o.settleTTL = d } }

// WithMaxWaiters bounds the requests Acquire keeps waiting at once
// (default DefaultMaxWaiters; 0: none waits). When it is full a request a
// rule refuses is refused at once, as by Admit, and counted in
// sluice_admission_wait_skipped_total{reason="full"}.
func WithMaxWaiters(n int) Option { return func(o *options) { o.maxWaiters = n } }

// WithRegisterer registers the Limiter's metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// withTickHook sets options.onTick (tests only).
func withTickHook(f func()) Option { return func(o *options) { o.onTick = f } }

// WithLogger logs Redis going away and coming back.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock makes clock the wall clock the Limiter cuts calendar periods
// with and ends rules that expire (Rule.Expires) by (time.Now by
// default): a test moves it past a period's end or an expiry rather than
// waiting for it. Token buckets and sliding windows keep Redis's clock.
func WithClock(clock func() time.Time) Option { return func(o *options) { o.clock = clock } }

// WithScriptClock makes the scripts read clock instead of Redis's TIME,
// which token buckets, sliding windows and the expiry of period counters
// follow: a test moves it past a rolling budget's seven days rather than
// waiting for them. Production leaves it unset: Redis's clock is the one
// every gateway shares, whatever their own clocks say. Leases and the
// refusal cache still keep the Limiter's monotonic clock, so a test that
// moves this clock uses rules without leases (exact rules, or
// WithLeaseFraction(0)) and WithRefusalCache(0).
func WithScriptClock(clock func() time.Time) Option {
	return func(o *options) { o.scriptClock = clock }
}
