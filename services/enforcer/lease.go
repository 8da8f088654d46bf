package enforcer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/enforcer/internal/flagwriter"
)

// Replicas and the leader lease. Every enforcer replica holds the whole
// state: it reads every signal (its own consumer group), the whole admin
// topic and the flags in Redis. Only the replica holding the lease writes
// flags and heartbeats, so two replicas' full rewrites never delete each
// other's flags; the others keep their state warm and take over when the
// lease lapses. See README.md for why a lease and not partition ownership.
//
// The lease alone cannot keep two writers apart: a leader paused past it
// (GC, a stopped VM, a slow Redis) resumes in the middle of a flush. So the
// lease also grants the versions the leader's flag writes carry (the
// fencing token, see internal/flagwriter's fence.go): each acquisition a
// floor above every version an earlier grant allowed, each renewal a
// ceiling; Redis refuses a hash write whose version is not newer than the
// hash's, so the paused leader's late writes are refused wherever its
// successor wrote.

// acquireScript takes or renews the lease KEYS[1] for ARGV[1] (this
// process) for ARGV[2] ms, and grants the versions of its flag writes.
// KEYS[2], on the lease's slot, holds the highest version any grant
// allowed. A lease held by exactly ARGV[3] (this replica's earlier process,
// seen at start; "" for none) is taken over at once; any other holder's is
// not. ARGV[4] is the newest version the caller saw in Redis: the grant
// goes above it. Answers {1, floor, ceiling, holder} when this process
// holds the lease — versions above floor and at most ceiling, floor above
// every earlier grant when it was just acquired — and {0, 0, 0, holder}
// otherwise. Versions are microseconds of Redis's clock, so they keep
// meaning "when written" (TIME before a write needs effects replication:
// the default from Redis 5, switched on explicitly for older ones).
var acquireScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local v = redis.call('GET', KEYS[1])
local renew = v == ARGV[1]
if v and not renew and v ~= ARGV[3] then
  return {0, '0', '0', v}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[2]) * 1000
local granted = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local floor = tonumber(ARGV[4]) or 0
if not renew then floor = math.max(floor, granted, now) end
local ceiling = math.max(granted, math.max(floor, now) + 2 * ttl)
redis.call('SET', KEYS[2], string.format('%.0f', ceiling))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, string.format('%.0f', floor), string.format('%.0f', ceiling), ARGV[1]}`)

// releaseScript deletes the lease if this process holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// leaseKey is the Redis key of the leader lease under prefix.
func leaseKey(prefix string) string { return prefix + "leader" }

// fenceKey is the key holding the highest version any lease granted. It
// must be on the lease key's hash slot (one script reads and writes both
// on a Redis Cluster): the lease key's own hash tag when it has one,
// otherwise a tag naming the whole lease key. A prefix with braces that do
// not form a hash tag cannot give both keys one slot.
func fenceKey(lease string) (string, error) {
	if open := strings.IndexByte(lease, '{'); open >= 0 {
		if end := strings.IndexByte(lease[open+1:], '}'); end > 0 {
			return lease + ":fence", nil // the lease's own hash tag decides
		}
	} else if !strings.Contains(lease, "}") {
		return lease + ":fence{" + lease + "}", nil
	}
	return "", fmt.Errorf("redis.key_prefix: %q (flags part) has braces that do not form a Redis Cluster hash tag ({…} with something inside); remove them or close the tag", strings.TrimSuffix(lease, "leader"))
}

// leaseMargin is how long before the lease would expire, measured from the
// send time of the request that renewed it, the leader stops sending flag
// writes: a renewal takes effect in Redis after it was sent, and the hosts'
// clocks run at slightly different rates.
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 3 }

// leaseState is runLease's view of the lease between attempts.
type leaseState struct {
	self, key, fence string
	// predecessor is the exact lease value of this replica's earlier
	// process, seen at start; only the first attempt may take it over.
	predecessor string
	// until is when the current grant stops allowing writes.
	until time.Time
}

// runLease competes for the lease until ctx ends, renewing it every third
// of its length. It hands the lead to the writer only after merging the
// flags in Redis into the table (what the previous leader wrote last), and
// takes it away when a renewal is refused or none succeeded within the
// lease less leaseMargin of its send, before another replica can acquire
// it; the writer itself sends nothing past that instant. On the way out it
// waits for the writer's last flush (writerDone) and releases the lease so
// that a follower takes over at once. It competes only once the admin
// topic's records present at start are applied (adminCaughtUp).
func (c *core) runLease(ctx context.Context, rdb redis.UniversalClient, replicaID string, adminCaughtUp <-chan struct{}, writerDone <-chan struct{}) error {
	var b [6]byte
	_, _ = rand.Read(b[:])
	st := &leaseState{self: replicaID + "/" + hex.EncodeToString(b[:]), key: leaseKey(c.cfg.KeyPrefix)}
	var err error
	if st.fence, err = fenceKey(st.key); err != nil {
		return err
	}
	c.writer.SetLeading(false)
	// Compete only once the admin topic's records present at start are in
	// the table (adminstate.go).
	select {
	case <-adminCaughtUp:
	case <-ctx.Done():
		return nil
	}
	st.predecessor = c.earlierProcess(ctx, rdb, st.key, replicaID, st.self)
	t := time.NewTicker(c.cfg.LeaderLease / 3)
	defer t.Stop()
	for {
		c.leaseAttempt(ctx, rdb, st)
		select {
		case <-ctx.Done():
			select {
			case <-writerDone:
			case <-time.After(c.cfg.ShutdownTimeout):
			}
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = releaseScript.Run(rctx, rdb, []string{st.key}, st.self).Err()
			cancel()
			c.leader.Set(0)
			return nil
		case <-t.C:
		}
	}
}

// earlierProcess returns the lease value of this replica's earlier
// process if it holds the lease (a restart: take it over at once rather
// than wait it out), or "". Only that exact value is taken over, and only
// by the first attempt: two processes running with one replica_id take
// the lease from each other at most once, never share it.
func (c *core) earlierProcess(ctx context.Context, rdb redis.UniversalClient, key, replicaID, self string) string {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.LeaderLease/3)
	defer cancel()
	v, err := rdb.Get(rctx, key).Result()
	if err != nil || v == self || !strings.HasPrefix(v, replicaID+"/") {
		return ""
	}
	c.log.Info("enforcer: the leader lease is held by an earlier process of this replica; taking it over", "holder", v, "replica", self)
	return v
}

// leaseAttempt takes or renews the lease once and hands the writer the
// lead (after merging Redis) or takes it away.
func (c *core) leaseAttempt(ctx context.Context, rdb redis.UniversalClient, st *leaseState) {
	ttl := c.cfg.LeaderLease
	rctx, cancel := context.WithTimeout(ctx, ttl/3)
	defer cancel()
	minFloor := c.writer.Newest()
	if !c.writer.Leading() {
		// Taking the lead: above every version in Redis, also those of a
		// writer that held no grant (a release before fencing).
		if v, err := rdb.Get(rctx, flags.Layout{Prefix: c.cfg.KeyPrefix}.VersionKey()).Int64(); err == nil {
			minFloor = max(minFloor, v)
		}
	}
	sent := time.Now() // the lease runs from here at the latest
	res, err := acquireScript.Run(rctx, rdb, []string{st.key, st.fence}, st.self, ttl.Milliseconds(), st.predecessor, minFloor).Slice()
	st.predecessor = ""
	got, g, holder, perr := leaseAnswer(res)
	if err == nil {
		err = perr
	}
	if err == nil && holder != "" {
		c.leaseHolder.Store(holder)
	}
	switch {
	case err == nil && got:
		g.Until = sent.Add(ttl - leaseMargin(ttl))
		st.until = g.Until
		if c.writer.Leading() {
			c.writer.Renew(g)
		} else if c.mergeRedis(ctx) {
			c.writer.Lead(g)
			c.leader.Set(1)
			c.log.Info("enforcer: leader lease taken; this replica writes the flags", "replica", st.self, "version_floor", g.Floor)
		}
	case err == nil || time.Now().After(st.until):
		if c.writer.Leading() {
			c.writer.SetLeading(false)
			c.log.Warn("enforcer: leader lease lost; this replica stops writing flags", "replica", st.self, "holder", holder, "err", err)
		}
		c.leader.Set(0)
	}
}

// leaseAnswer decodes acquireScript's answer.
func leaseAnswer(res []any) (got bool, g flagwriter.Grant, holder string, err error) {
	if res == nil {
		return false, g, "", nil
	}
	if len(res) != 4 {
		return false, g, "", errors.New("lease script: unexpected answer")
	}
	n, _ := res[0].(int64)
	floor, _ := res[1].(string)
	ceiling, _ := res[2].(string)
	holder, _ = res[3].(string)
	if g.Floor, err = strconv.ParseInt(floor, 10, 64); err != nil {
		return false, g, holder, fmt.Errorf("lease script: floor %q: %w", floor, err)
	}
	if g.Ceiling, err = strconv.ParseInt(ceiling, 10, 64); err != nil {
		return false, g, holder, fmt.Errorf("lease script: ceiling %q: %w", ceiling, err)
	}
	return n == 1, g, holder, nil
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
