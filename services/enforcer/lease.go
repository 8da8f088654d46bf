package enforcer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicas and the leader lease. Every enforcer replica holds the whole
// state: it reads every signal (its own consumer group), the whole admin
// topic and the flags in Redis. Only the replica holding the lease writes
// flags and heartbeats, so two replicas' full rewrites never delete each
// other's flags; the others keep their state warm and take over when the
// lease lapses. See README.md for why a lease and not partition ownership.

// acquireScript takes or renews the lease KEYS[1] for ARGV[1] (this
// process) for ARGV[2] ms. A lease held by an earlier process of the same
// replica (value starting with ARGV[3]) is taken over at once: a restarted
// replica need not wait out its own crashed predecessor's lease.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v or string.sub(v, 1, string.len(ARGV[3])) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`)

// releaseScript deletes the lease if this process holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// leaseKey is the Redis key of the leader lease under prefix.
func leaseKey(prefix string) string { return prefix + "leader" }

// runLease competes for the lease until ctx ends, renewing it every third
// of its length. It hands the lead to the writer only after merging the
// flags in Redis into the table (what the previous leader wrote last), and
// takes it away when a renewal is refused or none has succeeded for two
// thirds of the lease, before another replica can acquire it. On the way
// out it waits for the writer's last flush (writerDone) and releases the
// lease so that a follower takes over at once. It competes only once the
// admin topic's records present at start are applied (adminCaughtUp).
func (c *core) runLease(ctx context.Context, rdb redis.UniversalClient, replicaID string, adminCaughtUp <-chan struct{}, writerDone <-chan struct{}) error {
	var b [6]byte
	_, _ = rand.Read(b[:])
	self := replicaID + "/" + hex.EncodeToString(b[:])
	key, ttl := leaseKey(c.cfg.KeyPrefix), c.cfg.LeaderLease
	c.writer.SetLeading(false)
	// Compete only once the admin topic's records present at start are in
	// the table (adminstate.go).
	select {
	case <-adminCaughtUp:
	case <-ctx.Done():
		return nil
	}
	var lastOK time.Time
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		got, err := acquireScript.Run(rctx, rdb, []string{key}, self, ttl.Milliseconds(), replicaID+"/").Int()
		cancel()
		now := time.Now()
		switch {
		case err == nil && got == 1:
			lastOK = now
			if !c.writer.Leading() && c.mergeRedis(ctx) {
				c.writer.SetLeading(true)
				c.leader.Set(1)
				c.log.Info("enforcer: leader lease taken; this replica writes the flags", "replica", self)
			}
		case err == nil || now.Sub(lastOK) > 2*ttl/3:
			if c.writer.Leading() {
				c.writer.SetLeading(false)
				c.leader.Set(0)
				c.log.Warn("enforcer: leader lease lost; this replica stops writing flags", "replica", self, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			select {
			case <-writerDone:
			case <-time.After(c.cfg.ShutdownGrace):
			}
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = releaseScript.Run(rctx, rdb, []string{key}, self).Err()
			cancel()
			c.leader.Set(0)
			return nil
		case <-t.C:
		}
	}
}

// mergeRedis merges the flags in Redis into the table once; it reports
// whether it succeeded.
func (c *core) mergeRedis(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.LeaderLease)
	defer cancel()
	stored, err := c.writer.ReadStored(rctx)
	if err != nil {
		c.log.Warn("enforcer: reading the flags in redis before taking the lead failed; retrying", "err", err)
		return false
	}
	c.restore(stored, true)
	return true
}
