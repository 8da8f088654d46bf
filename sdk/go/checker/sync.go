package checker

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Run keeps the Checker in step with Redis until ctx is cancelled: it
// subscribes to the change channel, resyncs everything on start, after
// every (re)subscription and every ResyncInterval, refetches the tenants
// announced as changed, and tracks the enforcer's heartbeat to tell when the
// view has gone stale. Redis errors are logged and retried, never returned.
func (c *Checker) Run(ctx context.Context) error {
	ps := c.rdb.Subscribe(ctx, c.keys.Channel())
	defer ps.Close()
	// Messages beyond this buffer wait in go-redis; a lost one is repaired
	// by the next resync.
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(4096), redis.WithChannelHealthCheckInterval(time.Second))

	clock := time.NewTicker(clockResolution)
	defer clock.Stop()
	staleTick := time.NewTicker(c.staleCheckEvery())
	defer staleTick.Stop()
	resync := time.NewTicker(c.cfg.ResyncInterval)
	defer resync.Stop()
	beat := time.NewTicker(c.cfg.MaxStaleness / 4)
	defer beat.Stop()

	c.log.Info("checker: starting; until the first resync no flag and no fail mode is known",
		"allowed_until_stale", c.cfg.MaxStaleness.String(), "then_every_tenant_fails", string(c.cfg.DefaultFailMode))
	c.resync(ctx)
	pending := map[string]struct{}{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-clock.C:
			c.tickClock()
		case <-staleTick.C:
			c.updateStale()
		case <-beat.C:
			c.pollHeartbeat(ctx)
		case <-resync.C:
			c.resync(ctx)
			resync.Reset(c.resyncEvery())
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			needResync := c.collect(m, pending)
			// Drain what is already queued, so one refetch covers a burst.
			for drained := false; !drained; {
				select {
				case m, ok := <-ch:
					if !ok {
						return nil
					}
					needResync = c.collect(m, pending) || needResync
				default:
					drained = true
				}
			}
			if needResync || len(pending) > c.cfg.MaxPending {
				clear(pending)
				c.resync(ctx)
				continue
			}
			if len(pending) > 0 {
				c.refetch(ctx, pending)
				clear(pending)
			}
		}
	}
}

// clockResolution is how far a flag's expiry may be overshot.
const clockResolution = 2 * time.Millisecond

func (c *Checker) staleCheckEvery() time.Duration {
	d := c.cfg.MaxStaleness / 20
	if d < 5*time.Millisecond {
		d = 5 * time.Millisecond
	}
	return d
}

// collect files one pub/sub delivery; it returns true when a full resync
// is due (a new subscription: we may have missed anything before it).
func (c *Checker) collect(m any, pending map[string]struct{}) bool {
	switch m := m.(type) {
	case *redis.Subscription:
		return m.Kind == "subscribe"
	case *redis.Message:
		tenant, _, err := flags.ParseChange(m.Payload)
		if err != nil {
			c.log.Warn("checker: ignoring malformed change message", "err", err)
			return false
		}
		switch tenant {
		case flags.HeartbeatTenant:
			c.fresh()
			return false
		case flags.FailModeTenant:
			return true // rare (a policy change): a resync rereads them
		}
		pending[tenant] = struct{}{}
	}
	return false
}

func (c *Checker) fresh() {
	c.lastFresh.Store(time.Now().UnixNano())
	c.updateStale()
}

// tickClock advances the coarse clock Check reads.
func (c *Checker) tickClock() { c.clock.Store(time.Now().UnixNano()) }

func (c *Checker) updateStale() {
	age := time.Duration(time.Now().UnixNano() - c.lastFresh.Load())
	stale := age > c.cfg.MaxStaleness
	if c.stale.Swap(stale) != stale {
		if stale {
			c.log.Warn("checker: view is stale (no enforcer heartbeat); each tenant's fail mode applies, blacklists and manual breakers stay in force",
				"age", age.Round(time.Millisecond).String(), "max_staleness", c.cfg.MaxStaleness.String())
		} else {
			c.log.Info("checker: view is fresh again")
		}
	}
}

// pollHeartbeat is the pull half of liveness: a heartbeat key that exists
// means an enforcer beat within its expiry.
func (c *Checker) pollHeartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.MaxStaleness/2)
	defer cancel()
	n, err := c.rdb.Exists(ctx, c.keys.HeartbeatKey()).Result()
	if err == nil && n == 1 {
		c.fresh()
	}
}

const fetchBatch = 500

// refetch reads the announced tenants' hashes in pipelines.
func (c *Checker) refetch(ctx context.Context, pending map[string]struct{}) {
	names := make([]string, 0, len(pending))
	for t := range pending {
		names = append(names, t)
	}
	updates, err := c.fetch(ctx, names)
	if err != nil {
		c.log.Warn("checker: refetch failed; the next resync repairs it", "tenants", len(names), "err", err)
		return
	}
	c.apply(updates, 0, false)
}

// fetchTimeout bounds one pipeline of fetch. Each has its own: one
// deadline for the whole fetch made a resync of a million flagged tenants
// fail every time, however healthy Redis was (bench/README.md, "Growth
// curves").
const fetchTimeout = 10 * time.Second

func (c *Checker) fetch(ctx context.Context, tenants []string) (map[string]*tenantView, error) {
	out := make(map[string]*tenantView, len(tenants))
	for len(tenants) > 0 {
		n := min(len(tenants), fetchBatch)
		batch := tenants[:n]
		tenants = tenants[n:]
		cmds := make([]*redis.MapStringStringCmd, n)
		bctx, cancel := context.WithTimeout(ctx, fetchTimeout)
		_, err := c.rdb.Pipelined(bctx, func(p redis.Pipeliner) error {
			for i, t := range batch {
				cmds[i] = p.HGetAll(bctx, c.keys.TenantKey(t))
			}
			return nil
		})
		cancel()
		if err != nil {
			return nil, err
		}
		for i, t := range batch {
			out[t] = c.buildView(t, cmds[i].Val())
		}
	}
	return out, nil
}

// resyncCostShare is the most of its time a Checker spends in periodic
// resyncs: the next one waits at least resyncCostShare times as long as
// the last one took (and at least ResyncInterval). With a million flagged
// tenants a resync takes 10–25 s and 12 s of CPU; every 30 s it cost a
// gateway about 40% of a core on top of the refresh's refetches
// (bench/README.md, "Growth curves").
const resyncCostShare = 20

// resyncEvery is the wait before the next periodic resync.
func (c *Checker) resyncEvery() time.Duration {
	return max(c.cfg.ResyncInterval, resyncCostShare*time.Duration(c.lastResyncNS.Load()))
}

// resync rereads every tenant hash and the fail modes.
func (c *Checker) resync(ctx context.Context) {
	start := time.Now()
	defer func() { c.lastResyncNS.Store(int64(time.Since(start))) }()
	if err := c.resyncOnce(ctx); err != nil {
		c.log.Warn("checker: resync failed; serving the previous view", "err", err)
		return
	}
	c.resyncs.Add(1)
	if !c.synced.Swap(true) {
		c.log.Info("checker: first resync done; flags and fail modes known", "tenants_with_flags", c.Tenants())
	}
}

// resyncOnce rereads everything. It has no deadline of its own — with a
// million flagged tenants it takes tens of seconds — but every command is
// bounded by the client's read timeout and each fetch pipeline by
// fetchTimeout, so an unresponsive Redis fails it promptly.
func (c *Checker) resyncOnce(ctx context.Context) error {
	v0, err := c.rdb.Get(ctx, c.keys.VersionKey()).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	fm, err := c.rdb.HGetAll(ctx, c.keys.FailModeKey()).Result()
	if err != nil {
		return err
	}
	modes := make(map[string]FailMode, len(fm))
	for t, m := range fm {
		if m == string(FailOpen) || m == string(FailClosed) {
			modes[t] = FailMode(m)
		}
	}
	// Every master of a cluster: a tenant's hash is on its tenant's slot.
	seen := map[string]struct{}{}
	var tenants []string
	if err := c.keys.ScanTenants(ctx, c.rdb, func(t string) {
		if _, dup := seen[t]; !dup {
			seen[t] = struct{}{}
			tenants = append(tenants, t)
		}
	}); err != nil {
		return err
	}
	updates, err := c.fetch(ctx, tenants)
	if err != nil {
		return err
	}
	c.failModes.Store(&modes)
	c.readFlagTTL(ctx)
	// Liveness first: apply keeps operator flags Redis no longer holds only
	// while the view is stale (no enforcer), not once one is back.
	if n, err := c.rdb.Exists(ctx, c.keys.HeartbeatKey()).Result(); err == nil && n == 1 {
		c.fresh()
	}
	c.apply(updates, v0, true)
	return nil
}

// readFlagTTL takes the enforcer's flag_ttl from Redis. A missing key (an
// enforcer from before it was written) leaves what the Checker had, the
// default at first; so does a value out of bounds, logged, and a failed
// read, which the resync's other reads report.
func (c *Checker) readFlagTTL(ctx context.Context) {
	v, err := c.rdb.Get(ctx, c.keys.TTLKey()).Result()
	if err != nil {
		return
	}
	d, err := flags.ParseTTL(v)
	if err != nil {
		c.log.Warn("checker: ignoring the enforcer's flag ttl; keeping the previous one", "err", err, "flag_ttl", time.Duration(c.flagTTL.Load()).String())
		return
	}
	c.flagTTL.Store(int64(d))
}

// Resyncs returns how many full resyncs completed.
func (c *Checker) Resyncs() int64 { return c.resyncs.Load() }
