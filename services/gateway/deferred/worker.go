package deferred

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
)

// Executor runs a task (its run number run) through the gateway's request
// path. ctx ends when the gateway's drain is over; a run cut so is put
// back in the queue.
type Executor func(ctx context.Context, t *Task, run int) Outcome

// Outcome is how one run ended.
type Outcome struct {
	// Result is the answer (Status 0: the task could not run).
	Result Result
	// Retry, when positive, makes the answer a refusal for capacity (429,
	// 503): the task runs again after max(Retry, retry_min).
	Retry time.Duration
	// ErrorCode and Error fail the task with this reason (its key is
	// gone, its answer too long), keeping Result's status if any.
	ErrorCode, Error string
}

// Worker runs the deferred tasks of its share of the class topics'
// partitions, the highest class first (see the package documentation).
type Worker struct {
	cfg   Config
	kcfg  kafkaconn.Config
	store *store
	exec  Executor
	log   *slog.Logger
	m     *Metrics
	owner string
	now   func() time.Time
	cl    *kgo.Client
	class map[string]int // topic -> class index

	mu     sync.Mutex
	buf    [len(Classes)][]*item
	parts  map[topicPart]*partState
	paused [len(Classes)]bool
	// assigned is the partitions the group gives this Worker now: records
	// of any other are dropped (see add). running is the ids of the tasks
	// this Worker runs now: a task is never started twice at once, even
	// when its partition was taken away and given back and its record read
	// again meanwhile.
	assigned map[topicPart]bool
	running  map[string]bool
}

type topicPart struct {
	topic string
	part  int32
}

// partState tracks one assigned partition's offsets: those fetched and
// not yet finished, and the next to fetch, so that a commit never passes
// an unfinished task.
type partState struct {
	pending   map[int64]struct{}
	next      int64
	committed int64
	revoked   bool
}

// commitPoint is the offset to commit: the first unfinished one.
func (p *partState) commitPoint() int64 {
	point := p.next
	for off := range p.pending {
		point = min(point, off)
	}
	return point
}

// item is one fetched task waiting in its class's buffer.
type item struct {
	task      *Task
	class     int
	ps        *partState
	off       int64
	notBefore time.Time
	// token is the run token of the claim in progress: kept when a claim
	// fails (its answer may have been lost after Redis granted it), new
	// for each run.
	token string
}

// NewWorker returns a Worker of cfg's group that runs tasks with exec.
// m may be nil.
func NewWorker(cfg Config, kcfg kafkaconn.Config, rdb redis.UniversalClient, exec Executor, log *slog.Logger, m *Metrics) (*Worker, error) {
	if err := cfg.Validate("services.gateway.deferred."); err != nil {
		return nil, err
	}
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("services.gateway.deferred.workers: %d; a Worker needs at least 1", cfg.Workers)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	w := &Worker{cfg: cfg, kcfg: kcfg, store: newStore(rdb, cfg), exec: exec, log: log, m: m,
		owner: hex.EncodeToString(b[:]), now: time.Now, class: map[string]int{}, parts: map[topicPart]*partState{},
		assigned: map[topicPart]bool{}, running: map[string]bool{}}
	for i, p := range Classes {
		w.class[cfg.Topic(p)] = i
	}
	cl, err := kafkaconn.NewClient(kcfg,
		kgo.ConsumerGroup(cfg.Group),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.ConsumeTopics(cfg.Topics()...),
		// Offsets are committed up to the first unfinished task only.
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxPartitionBytes(int32(cfg.MaxTaskBytes+64<<10)),
		// No rebalance between a poll and the buffering of what it
		// fetched (poll): a revocation then finds every record of its
		// partitions buffered, and drops them.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, got map[string][]int32) { w.assign(got) }),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
			// Also called while the client closes, with ctx cancelled.
			w.drop(context.WithoutCancel(ctx), lost, true)
		}),
		kgo.OnPartitionsLost(func(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
			w.drop(ctx, lost, false)
		}),
	)
	if err != nil {
		return nil, err
	}
	w.cl = cl
	return w, nil
}

// Ready reports whether the Worker reaches Kafka, for /readyz.
func (w *Worker) Ready(ctx context.Context) error { return kafkaconn.Ready(w.cl)(ctx) }

// done is a run's end as Run learns it: the item, and when it runs
// again (zero: finished, its offset may be committed).
type done struct {
	it    *item
	again time.Time
}

// Run fetches and runs tasks until ctx ends; then it lets the runs in
// progress finish for cfg.Drain (those cut go back to their queue),
// commits what finished and closes its Kafka client.
func (w *Worker) Run(ctx context.Context) error {
	defer w.cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, w.cl, w.kcfg, w.cfg.Topics()...); err != nil {
		return err
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	fetched := make(chan polled)
	polling := make(chan struct{})
	go func() { defer close(polling); w.poll(pollCtx, fetched) }()
	runCtx, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()
	ends := make(chan done, w.cfg.Workers)
	running := 0
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	commit := time.NewTicker(time.Second)
	defer commit.Stop()
	for ctx.Err() == nil {
		next := w.dispatch(runCtx, &running, ends)
		wake.Reset(time.Until(next))
		select {
		case p := <-fetched:
			w.add(p.fs)
			close(p.added)
		case d := <-ends:
			running--
			w.end(d)
		case <-wake.C:
		case <-commit.C:
			w.commit(ctx)
		case <-ctx.Done():
		}
	}
	stopPoll()
	<-polling
	drain := time.NewTimer(w.cfg.Drain)
	defer drain.Stop()
	for running > 0 {
		select {
		case d := <-ends:
			running--
			w.end(d)
		case <-drain.C:
			w.log.Warn("deferred tasks still running at the end of the drain are cut and go back to their queue", "running", running)
			cut()
		}
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.commit(cctx)
	return nil
}

// polled is one poll's records, and the channel closed once they are
// buffered.
type polled struct {
	fs    kgo.Fetches
	added chan struct{}
}

// poll fetches records while ctx lives; paused class topics fetch
// nothing. A rebalance waits until what a poll fetched is buffered (the
// client blocks it from the poll's return to AllowRebalance), so its
// revocation drops every record of the partitions it takes away, and no
// record of theirs arrives after it.
func (w *Worker) poll(ctx context.Context, out chan<- polled) {
	defer w.cl.AllowRebalance()
	for {
		fs := w.cl.PollRecords(ctx, w.cfg.Buffer)
		if ctx.Err() != nil {
			return
		}
		fs.EachError(func(topic string, part int32, err error) {
			w.log.Warn("deferred: fetching tasks failed; retrying", "topic", topic, "partition", part, "err", err)
		})
		p := polled{fs: fs, added: make(chan struct{})}
		select {
		case out <- p:
		case <-ctx.Done():
			return
		}
		select {
		case <-p.added:
		case <-ctx.Done():
			return
		}
		w.cl.AllowRebalance()
	}
}

// assign records partitions the group gave this Worker.
func (w *Worker) assign(got map[string][]int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for topic, parts := range got {
		for _, p := range parts {
			w.assigned[topicPart{topic, p}] = true
		}
	}
}

// add puts fetched tasks in their class buffers and pauses the topics of
// full ones.
func (w *Worker) add(fs kgo.Fetches) {
	w.mu.Lock()
	fs.EachRecord(func(r *kgo.Record) {
		c, ok := w.class[r.Topic]
		if !ok {
			return
		}
		tp := topicPart{r.Topic, r.Partition}
		if !w.assigned[tp] {
			// Its partition is not this Worker's (any more): its state
			// must not come back, nor its commits.
			return
		}
		ps := w.parts[tp]
		if ps == nil {
			ps = &partState{pending: map[int64]struct{}{}, next: r.Offset, committed: -1}
			w.parts[tp] = ps
		}
		ps.next = max(ps.next, r.Offset+1)
		t, err := decodeTask(r.Value)
		if err != nil {
			w.log.Error("deferred: a task record cannot be read; skipped", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return
		}
		ps.pending[r.Offset] = struct{}{}
		w.insertLocked(&item{task: t, class: c, ps: ps, off: r.Offset})
	})
	pause := w.flowLocked()
	w.mu.Unlock()
	w.flow(pause)
}

// flowLocked says which class topics to pause (true) or resume (false),
// for those whose state changes; w.mu is held.
func (w *Worker) flowLocked() map[string]bool {
	var out map[string]bool
	for c := range w.buf {
		full := len(w.buf[c]) >= w.cfg.Buffer
		if w.m != nil {
			w.m.Buffered.WithLabelValues(string(Classes[c])).Set(float64(len(w.buf[c])))
		}
		if full != w.paused[c] {
			w.paused[c] = full
			if out == nil {
				out = map[string]bool{}
			}
			out[w.cfg.Topic(Classes[c])] = full
		}
	}
	return out
}

// flow pauses and resumes topics, outside w.mu (the client's rebalance
// callbacks take it).
func (w *Worker) flow(change map[string]bool) {
	for topic, pause := range change {
		if pause {
			w.cl.PauseFetchTopics(topic)
		} else {
			w.cl.ResumeFetchTopics(topic)
		}
	}
}

// dispatch starts ready tasks, the highest class first and FIFO within
// one, while workers are free; it returns when it should be called again
// for a task whose retry time comes.
func (w *Worker) dispatch(ctx context.Context, running *int, ends chan<- done) time.Time {
	now := w.now()
	next := now.Add(time.Hour)
	w.mu.Lock()
	for *running < w.cfg.Workers {
		it := w.takeLocked(now, &next)
		if it == nil {
			break
		}
		*running++
		w.running[it.task.ID] = true
		go func() { ends <- w.run(ctx, it) }()
	}
	pause := w.flowLocked()
	w.mu.Unlock()
	w.flow(pause)
	if w.m != nil {
		w.m.Running.Set(float64(*running))
	}
	return next
}

// takeLocked removes and returns the first ready task of the highest
// class that has one, lowering next to the earliest retry time it passes.
// A task this Worker runs already waits (its record read again after its
// partition came back): it is started once that run ended.
func (w *Worker) takeLocked(now time.Time, next *time.Time) *item {
	for c := range w.buf {
		for i, it := range w.buf[c] {
			if w.running[it.task.ID] {
				continue
			}
			if it.notBefore.After(now) {
				if it.notBefore.Before(*next) {
					*next = it.notBefore
				}
				continue
			}
			w.buf[c] = append(w.buf[c][:i], w.buf[c][i+1:]...)
			return it
		}
	}
	return nil
}

// run claims and runs one task and records its end.
func (w *Worker) run(ctx context.Context, it *item) done {
	t := it.task
	now := w.now()
	if it.token == "" {
		it.token = newRunToken()
	}
	c, err := w.store.claim(ctx, t.ID, w.owner, it.token, now)
	if err != nil {
		// Keep the token: Redis may have granted the claim whose answer
		// was lost, and the same claim again gets that run.
		w.log.Warn("deferred: cannot claim a task; retrying", "task", t.ID, "err", err)
		return done{it: it, again: now.Add(w.cfg.RetryMin)}
	}
	token := it.token
	it.token = "" // the next run claims with a new one
	switch c.code {
	case finished, gone:
		return done{it: it}
	case leased:
		return done{it: it, again: c.until}
	}
	v := c.run
	deadline := t.Created.Add(w.cfg.MaxWait)
	if !now.Before(deadline) {
		w.m.count(it.class, "expired")
		return w.finish(it, nil, "expired", fmt.Sprintf("waited longer than services.gateway.deferred.max_wait (%v) for capacity", w.cfg.MaxWait))
	}
	o := w.exec(ctx, t, int(v))
	if ctx.Err() != nil {
		// Cut by the end of the drain: back to the queue, for whichever
		// gateway reads the partition next.
		if err := w.store.release(context.WithoutCancel(ctx), t.ID, token, false, "shutdown", "the gateway running it shut down; it runs again"); err != nil {
			w.log.Warn("deferred: a task cut by the shutdown could not be put back; it runs again when its lease ends", "task", t.ID, "err", err)
		}
		return done{it: it, again: w.now()}
	}
	if o.Retry > 0 {
		again := w.now().Add(max(o.Retry, w.cfg.RetryMin))
		if again.Before(deadline) {
			w.m.count(it.class, "retried")
			msg := fmt.Sprintf("run %d was answered %d; it runs again after %v", v, o.Result.Status, max(o.Retry, w.cfg.RetryMin))
			if err := w.store.release(ctx, t.ID, token, true, "retrying", msg); err != nil {
				w.log.Warn("deferred: a refused task could not be put back", "task", t.ID, "err", err)
			}
			return done{it: it, again: again}
		}
	}
	var res *Result
	if o.Result.Status != 0 {
		res = &o.Result
	}
	return w.finish(it, res, o.ErrorCode, o.Error)
}

// finish stores a task's end; when Redis fails, the task stays unfinished
// and runs again (its offset is not committed).
func (w *Worker) finish(it *item, res *Result, code, msg string) done {
	if err := w.store.finish(context.Background(), it.task, w.now(), res, code, msg); err != nil {
		w.log.Warn("deferred: a task's end could not be stored; it runs again", "task", it.task.ID, "err", err)
		return done{it: it, again: w.now().Add(w.cfg.RetryMin)}
	}
	event := "failed"
	if res != nil && res.Status >= 200 && res.Status < 300 && code == "" {
		event = "succeeded"
	}
	w.m.count(it.class, event)
	return done{it: it}
}

// end records a run's end: a finished task's offset may be committed; a
// task to run again goes back to its place in its class.
func (w *Worker) end(d done) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.running, d.it.task.ID)
	if d.it.ps.revoked {
		return // its partition moved: the new owner reads it again
	}
	if d.again.IsZero() {
		delete(d.it.ps.pending, d.it.off)
		return
	}
	d.it.notBefore = d.again
	w.insertLocked(d.it)
}

// insertLocked puts it in its class buffer in submission order: a class's
// tasks come from several partitions, so Kafka's order is per partition
// only, and a task put back keeps its place.
func (w *Worker) insertLocked(it *item) {
	b := w.buf[it.class]
	i, _ := slices.BinarySearchFunc(b, it, func(x, y *item) int {
		if c := x.task.Created.Compare(y.task.Created); c != 0 {
			return c
		}
		return strings.Compare(x.task.ID, y.task.ID)
	})
	w.buf[it.class] = slices.Insert(b, i, it)
}

// commit commits, per partition, the offset of its first unfinished task.
func (w *Worker) commit(ctx context.Context) {
	w.mu.Lock()
	offs := w.commitsLocked(nil)
	w.mu.Unlock()
	w.commitOffsets(ctx, offs)
}

// commitsLocked returns the offsets to commit of parts (nil: all).
func (w *Worker) commitsLocked(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	out := map[string]map[int32]kgo.EpochOffset{}
	for tp, ps := range w.parts {
		if only != nil && !containsPart(only[tp.topic], tp.part) {
			continue
		}
		point := ps.commitPoint()
		if point <= ps.committed {
			continue
		}
		if out[tp.topic] == nil {
			out[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		out[tp.topic][tp.part] = kgo.EpochOffset{Epoch: -1, Offset: point}
	}
	return out
}

func containsPart(parts []int32, p int32) bool {
	for _, x := range parts {
		if x == p {
			return true
		}
	}
	return false
}

func (w *Worker) commitOffsets(ctx context.Context, offs map[string]map[int32]kgo.EpochOffset) {
	if len(offs) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cerr := kafkaconn.CommitSync(cctx, w.cl, offs)
	if cerr != nil {
		// The next commit carries the same offsets; a restart meanwhile
		// reads a few finished tasks again and skips them.
		w.log.Warn("deferred: task offsets not committed; retrying", "err", cerr)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for topic, m := range offs {
		for part, o := range m {
			if ps := w.parts[topicPart{topic, part}]; ps != nil {
				ps.committed = max(ps.committed, o.Offset)
			}
		}
	}
}

// drop forgets partitions this Worker no longer owns (committing what
// finished first when commit is set): their waiting tasks are dropped,
// their running ones finish but are no longer tracked.
func (w *Worker) drop(ctx context.Context, lost map[string][]int32, commit bool) {
	w.mu.Lock()
	var offs map[string]map[int32]kgo.EpochOffset
	if commit {
		offs = w.commitsLocked(lost)
	}
	for topic, parts := range lost {
		for _, p := range parts {
			tp := topicPart{topic, p}
			delete(w.assigned, tp)
			if ps := w.parts[tp]; ps != nil {
				ps.revoked = true
				delete(w.parts, tp)
			}
		}
	}
	for c := range w.buf {
		kept := w.buf[c][:0]
		for _, it := range w.buf[c] {
			if !it.ps.revoked {
				kept = append(kept, it)
			}
		}
		clear(w.buf[c][len(kept):])
		w.buf[c] = kept
	}
	w.mu.Unlock()
	if commit {
		w.commitOffsets(ctx, offs)
	}
}
