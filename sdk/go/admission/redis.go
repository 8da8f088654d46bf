package admission

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts every Sluice SDK runs; see "Scripts" in the package doc.
var (
	//go:embed scripts/admit.lua
	AdmitScript string
	//go:embed scripts/adjust.lua
	AdjustScript string

	admitScript  = redis.NewScript(AdmitScript)
	adjustScript = redis.NewScript(AdjustScript)
)

// maxKeysPerCall bounds the instances one background adjust call carries,
// and the renewals one background round trip carries.
const maxKeysPerCall = 64

// renewQueue bounds the background renewals waiting; when it is full a
// lease is renewed by the admission that finds it empty.
const renewQueue = 1024

// scriptCall is one EVALSHA: its keys and arguments, and the set positions
// of the instances it carries (admissions).
type scriptCall struct {
	slot uint16
	keys []string
	args []any
	idx  []int
}

// runScripts runs calls of one script in one round trip: a single call with
// EVALSHA falling back to EVAL, several in a pipeline (on a Cluster client
// the pipeline goes to each node in parallel) with the calls that met
// NOSCRIPT sent again with EVAL. Each command carries its own outcome (on
// a Cluster one master may fail while the others answer); the error is
// the first of them.
func (l *Limiter) runScripts(ctx context.Context, s *redis.Script, calls []scriptCall) ([]*redis.Cmd, error) {
	l.m.c.roundTrips.Add(1)
	if l.o.scriptClock != nil {
		// The scripts' optional last argument: the time to use instead of
		// Redis's (WithScriptClock).
		ms := l.o.scriptClock().UnixMilli()
		for i := range calls {
			calls[i].args = append(calls[i].args[:len(calls[i].args):len(calls[i].args)], ms)
		}
	}
	if len(calls) == 1 {
		c := s.Run(ctx, l.client, calls[0].keys, calls[0].args...)
		return []*redis.Cmd{c}, c.Err()
	}
	cmds := make([]*redis.Cmd, len(calls))
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = s.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	if err == nil {
		return cmds, nil
	}
	var retry []int
	for i, c := range cmds {
		if e := c.Err(); e != nil && isNoScript(e) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		l.m.c.roundTrips.Add(1)
		_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range retry {
				cmds[i] = s.Eval(ctx, p, calls[i].keys, calls[i].args...)
			}
			return nil
		})
	}
	for _, c := range cmds {
		if e := c.Err(); e != nil {
			return cmds, e
		}
	}
	return cmds, nil
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// group returns the call for slot, adding it; on a standalone Redis every
// instance goes into one call.
func (l *Limiter) group(calls []scriptCall, slot uint16, head []any) ([]scriptCall, *scriptCall) {
	if !l.cluster {
		slot = 0
	}
	for i := range calls {
		if calls[i].slot == slot {
			return calls, &calls[i]
		}
	}
	calls = append(calls, scriptCall{slot: slot, args: append([]any(nil), head...)})
	return calls, &calls[len(calls)-1]
}

type admitResult struct {
	refused        int // set position of the refusing instance, -1 if none
	avail, retryMs int64
	nowMs          int64
	// byInst is each instance's Redis time (by set position) when the
	// request went to more than one slot group: on a Cluster every master
	// has its own clock, and a window's refund must go to the granule its
	// own master debited.
	byInst []int64
	// periods is, by set position, the period id each calendar period
	// rule debited (nil without such rules).
	periods []int64
}

// admitRedis runs admit.lua for every instance not covered by a lease.
func (l *Limiter) admitRedis(ctx context.Context, t *Ticket, req *Request, leased uint64, now int64) (admitResult, error) {
	set := t.set
	var calls []scriptCall
	var renewing []*instance
	defer func() {
		for _, in := range renewing {
			in.renewing.Store(false)
		}
	}()
	needs := make([]int64, len(set.insts))
	wall := l.o.clock()
	var periods []int64
	for i, in := range set.insts {
		if leased&(1<<uint(i)) != 0 {
			continue
		}
		nd := need(in.r.Unit, req.estimate())
		needs[i] = nd
		var want int64
		if in.r.maxLease > 0 && !in.transient && in.renewing.CompareAndSwap(false, true) {
			renewing = append(renewing, in)
			want = in.leaseWant(l, nd, now)
		}
		var c *scriptCall
		calls, c = l.group(calls, in.slot, []any{0})
		c.keys = append(c.keys, in.key)
		rate, gran, id := in.r.args(wall)
		if id >= 0 {
			if periods == nil {
				periods = make([]int64, len(set.insts))
			}
			periods[i] = id
		}
		c.args = append(c.args, in.r.kind, in.r.argLimit, rate, gran, nd, want, in.r.floor(req.Priority))
		c.idx = append(c.idx, i)
	}
	for i := range calls {
		calls[i].args[0] = len(calls[i].keys)
	}
	wctx, cancel := context.WithTimeout(ctx, l.o.maxWait)
	defer cancel()
	cmds, err := l.runScripts(wctx, admitScript, calls)
	if err != nil {
		return admitResult{}, err
	}
	res := admitResult{refused: -1, periods: periods}
	replies := make([][]int64, len(calls))
	for ci, cmd := range cmds {
		r, err := cmd.Int64Slice()
		if err != nil {
			return admitResult{}, err
		}
		if len(r) < 2 || (r[0] == 1 && len(r) != 2+3*len(calls[ci].idx)) || (r[0] == 0 && len(r) != 5) {
			return admitResult{}, fmt.Errorf("admit.lua replied %v", r)
		}
		replies[ci] = r
		if res.nowMs == 0 {
			res.nowMs = r[1]
		}
		if r[0] == 0 {
			pos := calls[ci].idx[r[2]-1]
			if res.refused < 0 || pos < res.refused {
				res.refused, res.avail, res.retryMs = pos, r[3], r[4]
			}
		}
	}
	if res.refused >= 0 {
		// On a Cluster, calls to other slots may have debited: refund them.
		var back []adjustment
		for ci, r := range replies {
			if r[0] != 1 {
				continue
			}
			for j, pos := range calls[ci].idx {
				in := set.insts[pos]
				at := int64(-1)
				if in.r.gran > 0 {
					at = r[1] / in.r.gran
				} else if periods != nil && in.r.period != nil {
					at = periods[pos]
				}
				back = append(back, adjustment{in: in, at: at, delta: -(needs[pos] + r[3+3*j])})
			}
		}
		if len(back) > 0 {
			// What Redis did not answer is sent again with the same
			// markers; if the queue is full it is dropped and counted.
			failed, _ := l.applyMarked(wctx, l.seal(back, batchMarker(l.newID())))
			l.pend.queue(l, failed)
		}
		return res, nil
	}
	if len(calls) > 1 {
		res.byInst = make([]int64, len(set.insts))
	}
	for ci, r := range replies {
		for j, pos := range calls[ci].idx {
			in := set.insts[pos]
			in.noteReply(r[2+3*j], r[4+3*j], now)
			if g := r[3+3*j]; g > 0 {
				in.addLease(l, g, r[1], now)
			}
			if res.byInst != nil {
				res.byInst[pos] = r[1]
			}
		}
	}
	return res, nil
}

// markedCall is one adjust.lua call guarded by its marker key (KEYS[1]):
// corrections of instances of one slot, applied at most once whatever
// happens to the reply, and sent again exactly as they are until Redis
// answers.
type markedCall struct {
	slot   uint16
	marker string
	adjs   []adjustment
	settle bool // a ticket's settlement, for the metrics
}

// markerFunc names the marker of a call from its first instance key (whose
// hash tag it shares) and its position in the batch.
type markerFunc func(first string, n int) string

// batchMarker marks the calls of a batch of background corrections:
// <first instance key>:adj:<batch id>.<n>.
func batchMarker(id string) markerFunc {
	return func(first string, n int) string { return first + ":adj:" + id + "." + strconv.Itoa(n) }
}

// seal groups corrections into marked calls: one per slot (on a
// standalone Redis, one in all) of at most maxKeysPerCall instances.
func (l *Limiter) seal(list []adjustment, marker markerFunc) []markedCall {
	var calls []markedCall
	for _, a := range list {
		if a.delta == 0 {
			continue
		}
		slot := a.in.slot
		if !l.cluster {
			slot = 0
		}
		var c *markedCall
		for i := range calls {
			if calls[i].slot == slot && len(calls[i].adjs) < maxKeysPerCall {
				c = &calls[i]
				break
			}
		}
		if c == nil {
			calls = append(calls, markedCall{slot: slot, marker: marker(a.in.key, len(calls))})
			c = &calls[len(calls)-1]
		}
		c.adjs = append(c.adjs, a)
	}
	return calls
}

// maxCallsPerTrip bounds the marked calls one round trip carries.
const maxCallsPerTrip = 256

// applyMarked runs marked calls, maxCallsPerTrip a round trip, and returns
// those Redis did not answer (with the first error): a failure of one
// master leaves the calls the others answered applied, and only the
// failed ones come back to be sent again. A call Redis answered with 0
// had been applied before (a reply lost after the bound).
func (l *Limiter) applyMarked(ctx context.Context, calls []markedCall) ([]markedCall, error) {
	ttl := l.o.settleTTL.Milliseconds()
	wall := l.o.clock()
	for start := 0; start < len(calls); start += maxCallsPerTrip {
		chunk := calls[start:min(start+maxCallsPerTrip, len(calls))]
		sc := make([]scriptCall, len(chunk))
		for i, c := range chunk {
			sc[i] = scriptCall{slot: c.slot, keys: make([]string, 0, 1+len(c.adjs)), args: make([]any, 0, 2+6*len(c.adjs))}
			sc[i].keys = append(sc[i].keys, c.marker)
			sc[i].args = append(sc[i].args, ttl, len(c.adjs))
			for _, a := range c.adjs {
				r := a.in.r
				sc[i].keys = append(sc[i].keys, a.in.key)
				rate, gran, _ := r.args(wall)
				sc[i].args = append(sc[i].args, r.kind, r.argLimit, rate, gran, a.delta, a.at)
			}
		}
		cmds, err := l.runScripts(ctx, adjustScript, sc)
		var failed []markedCall
		for i, c := range chunk {
			if cmds[i].Err() != nil {
				failed = append(failed, c)
				continue
			}
			l.answered(c, cmds[i].Val())
		}
		if err != nil {
			return append(failed, calls[start+len(chunk):]...), err
		}
	}
	return nil, nil
}

// answered counts a marked call Redis answered: 1 applied now, 0 applied
// before.
func (l *Limiter) answered(c markedCall, reply any) {
	applied, _ := reply.(int64)
	if c.settle {
		if applied == 1 {
			l.m.settles.WithLabelValues("applied").Inc()
		} else {
			l.m.settles.WithLabelValues("duplicate").Inc()
		}
	}
	var local int64
	for _, a := range c.adjs {
		if a.local {
			local += max(a.delta, 0)
		}
	}
	if local > 0 {
		l.m.reconciled.Add(float64(local))
	}
}

// newID returns an id no other batch or settlement of any gateway has:
// this Limiter's random nonce and a sequence number.
func (l *Limiter) newID() string {
	return l.nonce + "." + strconv.FormatUint(l.seq.Add(1), 36)
}

// renewSoon asks the renewer to top up in's lease before it runs out, so
// that a busy instance's admissions never wait for a renewal.
func (l *Limiter) renewSoon(in *instance) {
	if l.down.Load() || !in.renewing.CompareAndSwap(false, true) {
		return
	}
	select {
	case l.renewQ <- in:
	default:
		in.renewing.Store(false)
	}
}

// renewer tops up leases in the background, batching the renewals that
// are waiting into one pipelined round trip.
func (l *Limiter) renewer() {
	defer close(l.renewDone)
	batch := make([]*instance, 0, maxKeysPerCall)
	for {
		select {
		case <-l.stop:
			return
		case in := <-l.renewQ:
			batch = append(batch[:0], in)
		}
	fill:
		for len(batch) < maxKeysPerCall {
			select {
			case in := <-l.renewQ:
				batch = append(batch, in)
			default:
				break fill
			}
		}
		l.renew(batch)
	}
}

// renew asks Redis for a lease for each instance, each in a call of its
// own (need 0), so one rule at its limit does not hold back the others.
func (l *Limiter) renew(batch []*instance) {
	now := l.now()
	calls := make([]scriptCall, 0, len(batch))
	ins := make([]*instance, 0, len(batch))
	for _, in := range batch {
		want := int64(0)
		if !l.down.Load() {
			want = in.leaseWant(l, 1, now)
		}
		if want == 0 {
			in.renewing.Store(false)
			continue
		}
		r := in.r
		calls = append(calls, scriptCall{slot: in.slot, keys: []string{in.key}, args: []any{1, r.kind, r.argLimit, r.argRate, r.argGran, 0, want, 0}})
		ins = append(ins, in)
	}
	defer func() {
		for _, in := range ins {
			in.renewing.Store(false)
		}
	}()
	if len(calls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.o.maxWait)
	defer cancel()
	cmds, err := l.runScripts(ctx, admitScript, calls)
	if err != nil {
		l.markDown(err)
		return
	}
	for i, c := range cmds {
		r, err := c.Int64Slice()
		if err != nil || len(r) != 5 || r[0] != 1 {
			continue // no room: the next admission finds out from Redis
		}
		in := ins[i]
		in.noteReply(r[2], r[4], now)
		if r[3] > 0 {
			in.addLease(l, r[3], r[1], now)
		}
	}
}

// probe asks Redis whether it is back, within the wait bound.
func (l *Limiter) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.o.maxWait)
	defer cancel()
	l.m.c.roundTrips.Add(1)
	return l.client.Ping(ctx).Err()
}

// run is the background work: probing an unreachable Redis, sending
// pending corrections, returning expired leases, forgetting idle instances.
func (l *Limiter) run() {
	defer close(l.done)
	tick := time.NewTicker(l.o.probe)
	defer tick.Stop()
	lastSweep := l.now()
	for {
		select {
		case <-l.stop:
			// No renewal may land after the leases are returned.
			<-l.renewDone
			l.shutdown()
			return
		case <-tick.C:
		case <-l.kick:
		}
		l.step(&lastSweep)
		if l.o.onTick != nil {
			l.o.onTick()
		}
	}
}

// step is one iteration of run.
func (l *Limiter) step(lastSweep *int64) {
	ctx := context.Background()
	now := l.now()
	l.coarse.Store(now)
	l.expireLeases(now, false)
	if l.down.Load() {
		if err := l.probe(ctx); err != nil {
			return
		}
	}
	if err := l.flushPending(ctx); err != nil {
		l.markDown(err)
		return
	}
	if l.down.CompareAndSwap(true, false) {
		l.o.log.Info("admission: Redis is back; local debits reconciled")
	}
	if now-*lastSweep > int64(l.o.idle)/4 {
		l.sweep(now)
		*lastSweep = now
	}
}

func (l *Limiter) flushPending(ctx context.Context) error {
	if l.pend.len() == 0 {
		return nil
	}
	// Off the request path: a batch may take longer than one admission.
	ctx, cancel := context.WithTimeout(ctx, max(l.o.maxWait, time.Second))
	defer cancel()
	return l.pend.flush(ctx, l)
}

// expireLeases returns the rests of expired leases (all of them if force).
func (l *Limiter) expireLeases(now int64, force bool) {
	l.leasedMu.Lock()
	list := make([]*instance, 0, len(l.leased))
	for in := range l.leased {
		list = append(list, in)
	}
	l.leasedMu.Unlock()
	for _, in := range list {
		if !in.expireLease(l, now, force) {
			l.leasedMu.Lock()
			in.mu.Lock()
			if !in.inLeased {
				delete(l.leased, in)
			}
			in.mu.Unlock()
			l.leasedMu.Unlock()
		}
	}
}

// sweep forgets request shapes and instances unused for the idle TTL.
func (l *Limiter) sweep(now int64) {
	g := l.gen.Load()
	cut := now - int64(l.o.idle)
	for i := range g.sets {
		sh := &g.sets[i]
		sh.mu.Lock()
		for h, s := range sh.m {
			var keep *matchSet
			for s != nil {
				next := s.next
				if s.lastUsed.Load() < cut {
					g.nsets.Add(-1)
					l.unref(g, s)
				} else {
					s.next, keep = keep, s
				}
				s = next
			}
			if keep == nil {
				delete(sh.m, h)
			} else {
				sh.m[h] = keep
			}
		}
		sh.mu.Unlock()
	}
	var gone []*instance
	g.imu.Lock()
	for k, in := range g.insts {
		if in.refs <= 0 && in.lastUsed.Load() < cut {
			delete(g.insts, k)
			gone = append(gone, in)
		}
	}
	g.imu.Unlock()
	for _, in := range gone {
		in.retire(l)
	}
}

// retireAll sends what a replaced generation's instances hold to Redis.
func (l *Limiter) retireAll(g *generation) {
	g.imu.Lock()
	list := make([]*instance, 0, len(g.insts))
	for _, in := range g.insts {
		list = append(list, in)
	}
	g.imu.Unlock()
	for _, in := range list {
		in.retire(l)
	}
	l.wake()
}

// shutdown returns every lease and flushes, trying for a few seconds.
func (l *Limiter) shutdown() {
	l.expireLeases(l.now(), true)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := l.flushPending(context.Background()); err == nil {
			return
		}
		time.Sleep(l.o.probe)
	}
}
