package deferred

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/schemas"
)

// store keeps task states and the per-class counts in Redis. Every script
// touches one key, so it works on a Redis Cluster as well (the task id or
// the class is the key's hash tag).
type store struct {
	rdb     redis.UniversalClient
	cfg     Config
	timeout time.Duration
}

// redisTimeout bounds each Redis call of a submission, a claim, a state
// change or a read.
const redisTimeout = 2 * time.Second

func newStore(rdb redis.UniversalClient, cfg Config) *store {
	return &store{rdb: rdb, cfg: cfg, timeout: redisTimeout}
}

func (s *store) taskKey(id string) string { return s.cfg.KeyPrefix + "task:{" + id + "}" }

func (s *store) pendingKey(p schemas.Priority) string {
	return s.cfg.KeyPrefix + "pending:{" + string(Classes[classIndex(p)]) + "}"
}

// ErrFull refuses a submission to a class that holds MaxPending tasks.
var ErrFull = errors.New("deferred: the class's queue is full")

// reserveScript counts a task into its class unless the class is full:
// entries older than ARGV[2] (ms) went past max_wait and are pruned.
// ARGV: now ms, oldest ms, max, id, ttl ms.
var reserveScript = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1`)

// reserve counts t into its class (ErrFull when it is full) and stores
// its state as queued.
func (s *store) reserve(ctx context.Context, t *Task, now time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ok, err := reserveScript.Run(ctx, s.rdb, []string{s.pendingKey(t.Priority)},
		now.UnixMilli(), now.Add(-s.cfg.MaxWait).UnixMilli(), s.cfg.MaxPending, t.ID, s.cfg.MaxWait.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("deferred: count the task in: %w", err)
	}
	if ok == 0 {
		return ErrFull
	}
	key := s.taskKey(t.ID)
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "status", string(Queued), "tenant", t.Tenant, "key_id", t.KeyID, "priority", string(t.Priority),
			"endpoint", t.Endpoint, "model", t.Model, "created", t.Created.UnixMilli(), "runs", 0, "retries", 0)
		p.PExpire(ctx, key, s.cfg.MaxWait+s.cfg.ResultTTL)
		return nil
	})
	if err != nil {
		s.unreserve(context.WithoutCancel(ctx), t)
		return fmt.Errorf("deferred: store the task's state: %w", err)
	}
	return nil
}

// unreserve takes t out of its class's count (a submission that failed
// after reserve, or a task that finished).
func (s *store) unreserve(ctx context.Context, t *Task) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_ = s.rdb.ZRem(ctx, s.pendingKey(t.Priority), t.ID).Err()
}

// forget removes a task that was never accepted (its record did not
// reach Kafka).
func (s *store) forget(ctx context.Context, t *Task) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_ = s.rdb.Del(ctx, s.taskKey(t.ID)).Err()
	s.unreserve(ctx, t)
}

// claim answers.
const (
	claimed  = 0 // run is the run's number
	finished = 1 // succeeded or failed already
	leased   = 2 // a run holds it until the returned time
	gone     = 3 // no state: expired, or never accepted
)

// claimResult is a claim's answer: its code, the run's number (claimed)
// or when the holding run's lease ends (leased), and the run's token.
type claimResult struct {
	code  int
	run   int64
	until time.Time
	token string
}

// claimScript marks a task running for run token ARGV[4] of owner ARGV[2]
// until ARGV[3] (ms), unless it is finished, unknown, or running under
// another token whose lease has not ended (ARGV[1] is now in ms) — whoever
// asks, its own gateway included: a task is run by one run at a time. A
// claim with the running token (the same claim sent again after an answer
// was lost) answers that run again. It answers {code, value}.
var claimScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'status', 'token', 'lease_until', 'runs')
if not v[1] then return {3, 0} end
if v[1] == 'succeeded' or v[1] == 'failed' then return {1, 0} end
if v[1] == 'running' and v[2] == ARGV[4] then return {0, tonumber(v[4] or '0')} end
if v[1] == 'running' and tonumber(v[3] or '0') > tonumber(ARGV[1]) then
  return {2, tonumber(v[3])}
end
local runs = redis.call('HINCRBY', KEYS[1], 'runs', 1)
redis.call('HSET', KEYS[1], 'status', 'running', 'owner', ARGV[2], 'token', ARGV[4], 'lease_until', ARGV[3], 'started', ARGV[1])
return {0, runs}`)

// newRunToken returns a fresh run token.
func newRunToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// claim claims task id for the run of owner with token, leased until
// now+Lease. A claim sent again with the same token (its answer was lost)
// gets the same run.
func (s *store) claim(ctx context.Context, id, owner, token string, now time.Time) (claimResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := claimScript.Run(ctx, s.rdb, []string{s.taskKey(id)}, now.UnixMilli(), owner, now.Add(s.cfg.Lease).UnixMilli(), token).Int64Slice()
	if err != nil {
		return claimResult{}, fmt.Errorf("deferred: claim %s: %w", id, err)
	}
	if len(v) != 2 {
		return claimResult{}, fmt.Errorf("deferred: claim %s: unexpected answer %v", id, v)
	}
	r := claimResult{code: int(v[0]), token: token}
	switch r.code {
	case claimed:
		r.run = v[1]
	case leased:
		r.until = time.UnixMilli(v[1])
	}
	return r, nil
}

// releaseScript puts back in the queue a task its run ARGV[1] (token)
// holds: ARGV[2] is 1 when the run was refused (a retry) and 0 when it was
// cut by a shutdown; ARGV[3] and ARGV[4] say why. Another run's token
// changes nothing.
var releaseScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'status', 'token')
if v[1] ~= 'running' or v[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'owner', '', 'token', '', 'lease_until', 0, 'error_code', ARGV[3], 'error', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'retries', tonumber(ARGV[2]))
return 1`)

// release puts task id back in the queue if run token holds it.
func (s *store) release(ctx context.Context, id, token string, retry bool, code, msg string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	r := 0
	if retry {
		r = 1
	}
	if err := releaseScript.Run(ctx, s.rdb, []string{s.taskKey(id)}, token, r, code, msg).Err(); err != nil {
		return fmt.Errorf("deferred: put %s back: %w", id, err)
	}
	return nil
}

// finishScript records a task's end once: a second end (a run that
// outlived its lease while another finished the task) changes nothing.
// ARGV: status, now ms, ttl ms, result status (0: none), content type,
// body, error code, error.
var finishScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'status')
if not st or st == 'succeeded' or st == 'failed' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'finished', ARGV[2], 'owner', '', 'token', '', 'lease_until', 0,
  'code', ARGV[4], 'content_type', ARGV[5], 'body', ARGV[6], 'error_code', ARGV[7], 'error', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

// finish records t's end: its result (nil when it could not run) or why
// it failed, and takes it out of its class's count.
func (s *store) finish(ctx context.Context, t *Task, now time.Time, res *Result, errCode, errMsg string) error {
	st, code, ctype, body := Failed, 0, "", []byte(nil)
	if res != nil {
		code, ctype, body = res.Status, res.ContentType, res.Body
		if code >= 200 && code < 300 && errCode == "" {
			st = Succeeded
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := finishScript.Run(cctx, s.rdb, []string{s.taskKey(t.ID)}, string(st), now.UnixMilli(), s.cfg.ResultTTL.Milliseconds(),
		code, ctype, body, errCode, errMsg).Err()
	if err != nil {
		return fmt.Errorf("deferred: store the end of %s: %w", t.ID, err)
	}
	s.unreserve(ctx, t)
	return nil
}

// get reads a task's state; ok is false when there is none (unknown or
// expired).
func (s *store) get(ctx context.Context, id string) (st State, ok bool, err error) {
	if !validID(id) {
		return State{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	m, err := s.rdb.HGetAll(ctx, s.taskKey(id)).Result()
	if err != nil {
		return State{}, false, fmt.Errorf("deferred: read %s: %w", id, err)
	}
	if len(m) == 0 || m["status"] == "" {
		return State{}, false, nil
	}
	ms := func(k string) time.Time {
		v, _ := strconv.ParseInt(m[k], 10, 64)
		if v <= 0 {
			return time.Time{}
		}
		return time.UnixMilli(v)
	}
	atoi := func(k string) int { v, _ := strconv.Atoi(m[k]); return v }
	st = State{ID: id, Status: Status(m["status"]), Tenant: m["tenant"], Priority: schemas.Priority(m["priority"]),
		Endpoint: m["endpoint"], Model: m["model"], Created: ms("created"), Started: ms("started"), Finished: ms("finished"),
		Runs: atoi("runs"), Retries: atoi("retries"), ErrorCode: m["error_code"], Error: m["error"]}
	if c := atoi("code"); c > 0 && st.Status.terminal() {
		st.Result = &Result{Status: c, ContentType: m["content_type"], Body: []byte(m["body"])}
	}
	return st, true, nil
}
