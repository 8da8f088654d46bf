package deferred

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/schemas"
)

// within bounds every wait of these tests.
const within = 60 * time.Second

// env is one test's own topics, group and Redis prefix on the real Kafka
// and Redis.
type env struct {
	cfg  Config
	kcfg kafkaconn.Config
	rdb  redis.UniversalClient
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	e := &env{cfg: DefaultConfig(), kcfg: itest.Kafka(t)}
	e.cfg.Enabled = true
	e.cfg.TopicPrefix = itest.Unique(t, "deferred_")
	e.cfg.Group = itest.Unique(t, "deferred_group_")
	e.cfg.KeyPrefix = itest.Unique(t, "sluice:test:") + ":"
	e.cfg.RetryMin = 10 * time.Millisecond
	e.cfg.Drain = 200 * time.Millisecond
	e.rdb = redisconn.NewClient(itest.Redis(t))
	t.Cleanup(func() {
		for _, k := range e.rdb.Keys(context.Background(), e.cfg.KeyPrefix+"*").Val() {
			e.rdb.Del(context.Background(), k)
		}
		e.rdb.Close()
	})
	return e
}

func (e *env) queue(t *testing.T) *Queue {
	t.Helper()
	q, err := NewQueue(context.Background(), e.cfg, e.kcfg, e.rdb, NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	return q
}

// worker starts a Worker running exec; the returned function stops it.
func (e *env) worker(t *testing.T, exec Executor) func() {
	t.Helper()
	w, err := NewWorker(e.cfg, e.kcfg, e.rdb, exec, slog.New(slog.DiscardHandler), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	return itest.Start(t, "deferred worker", w.Run)
}

func submit(t *testing.T, q *Queue, tenant string, p schemas.Priority, body string) *Task {
	t.Helper()
	task := &Task{Tenant: tenant, KeyID: "key-" + tenant, Priority: p, Endpoint: "/v1/chat/completions", Model: "m", Body: []byte(body)}
	if err := q.Submit(context.Background(), task); err != nil {
		t.Fatalf("submit %s: %v", body, err)
	}
	return task
}

// waitState polls task id until it is finished and returns its state.
func waitState(t *testing.T, q *Queue, tenant, id string) State {
	t.Helper()
	var st State
	itest.EventuallyNoError(t, within, "task "+id+" finished", func() error {
		var ok bool
		var err error
		st, ok, err = q.Get(context.Background(), tenant, id)
		switch {
		case err != nil:
			return err
		case !ok:
			return errors.New("no state")
		case !st.Status.terminal():
			return fmt.Errorf("status %s", st.Status)
		}
		return nil
	})
	return st
}

func ok200(body string) Outcome {
	return Outcome{Result: Result{Status: http.StatusOK, ContentType: "application/json", Body: []byte(body)}}
}

// TestFullClassIsRefusedAndRoomReturns: a class holds at most max_pending
// unfinished tasks across the fleet — two Queues (two gateways) count
// into one bound; the next submission is refused with ErrFull while other
// classes still accept, and a finished task makes room. Another tenant
// cannot read a task, nor can anyone an unknown id.
func TestFullClassIsRefusedAndRoomReturns(t *testing.T) {
	e := newEnv(t)
	e.cfg.MaxPending = 2
	q1, q2 := e.queue(t), e.queue(t)
	a := submit(t, q1, "acme", schemas.PriorityLow, `{"n":1}`)
	submit(t, q2, "acme", schemas.PriorityLow, `{"n":2}`)
	err := q1.Submit(context.Background(), &Task{Tenant: "acme", KeyID: "k", Priority: schemas.PriorityLow, Endpoint: "/v1/chat/completions", Body: []byte(`{}`)})
	if !errors.Is(err, ErrFull) {
		t.Fatalf("third low task: %v, want ErrFull", err)
	}
	submit(t, q2, "acme", schemas.PriorityHigh, `{"n":3}`)
	if err := q1.store.finish(context.Background(), a, time.Now(), &Result{Status: 200, Body: []byte(`{}`)}, "", ""); err != nil {
		t.Fatal(err)
	}
	submit(t, q1, "acme", schemas.PriorityLow, `{"n":4}`)
	if err := q1.Submit(context.Background(), &Task{Tenant: "acme", Priority: schemas.PriorityLow, KeyID: "k", Endpoint: "/x", Body: make([]byte, e.cfg.MaxTaskBytes+1)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized task: %v, want ErrTooLarge", err)
	}
	if _, ok, err := q2.Get(context.Background(), "other", a.ID); ok || err != nil {
		t.Fatalf("another tenant read the task: %v %v", ok, err)
	}
	if _, ok, _ := q2.Get(context.Background(), "acme", "task_../../x"); ok {
		t.Fatal("a malformed id was read")
	}
	if st, ok, err := q2.Get(context.Background(), "acme", a.ID); !ok || err != nil || st.Status != Succeeded {
		t.Fatalf("state %+v %v %v", st, ok, err)
	}
}

// TestHigherClassesRunFirst: with one worker busy on the first task it
// fetched, the others wait in their class buffers; once it is free they
// run critical, high, normal, low — FIFO among the low ones.
func TestHigherClassesRunFirst(t *testing.T) {
	e := newEnv(t)
	e.cfg.Workers = 1
	q := e.queue(t)
	var order []string
	var mu sync.Mutex
	release := make(chan struct{})
	exec := func(ctx context.Context, task *Task, run int) Outcome {
		mu.Lock()
		order = append(order, string(task.Body))
		first := len(order) == 1
		mu.Unlock()
		if first {
			<-release
		}
		return ok200(`{}`)
	}
	bodies := map[schemas.Priority][]string{
		schemas.PriorityLow: {"low-1", "low-2", "low-3"}, schemas.PriorityNormal: {"normal"},
		schemas.PriorityCritical: {"critical"}, schemas.PriorityHigh: {"high"},
	}
	var tasks []*Task
	for _, p := range []schemas.Priority{schemas.PriorityLow, schemas.PriorityNormal, schemas.PriorityCritical, schemas.PriorityHigh} {
		for _, b := range bodies[p] {
			tasks = append(tasks, submit(t, q, "acme", p, fmt.Sprintf("%q", b)))
		}
	}
	w, err := NewWorker(e.cfg, e.kcfg, e.rdb, exec, slog.New(slog.DiscardHandler), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	itest.Start(t, "deferred worker", w.Run)
	itest.Eventually(t, within, "the other 5 tasks buffered behind the first", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		n := 0
		for _, b := range w.buf {
			n += len(b)
		}
		return n == 5
	})
	close(release)
	for _, task := range tasks {
		waitState(t, q, "acme", task.ID)
	}
	mu.Lock()
	got := slices.Clone(order)
	mu.Unlock()
	rank := map[string]int{`"critical"`: 0, `"high"`: 1, `"normal"`: 2, `"low-1"`: 3, `"low-2"`: 4, `"low-3"`: 5}
	if rest := got[1:]; !slices.IsSortedFunc(rest, func(a, b string) int { return rank[a] - rank[b] }) || len(got) != 6 {
		t.Fatalf("run order %v: after the first, want critical, high, normal, then the low ones in order", got)
	}
}

// busyExec answers 429 to every run of the task whose body is
// "always-busy" and to the first two runs of any other, then 200; it records
// each task's run numbers in runs.
func busyExec(mu *sync.Mutex, runs map[string][]int) func(ctx context.Context, task *Task, run int) Outcome {
	return func(ctx context.Context, task *Task, run int) Outcome {
		mu.Lock()
		runs[task.ID] = append(runs[task.ID], run)
		n := len(runs[task.ID])
		mu.Unlock()
		rec := NewRecorder(1024)
		if string(task.Body) == `"always-busy"` || n < 3 {
			rec.Header().Set("Retry-After", "0")
			http.Error(rec, `{"error":{"code":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
			return rec.Outcome()
		}
		rec.Header().Set("Content-Type", "application/json")
		_, _ = rec.Write([]byte(`{"answer":42}`))
		return rec.Outcome()
	}
}

// TestRefusedRunsWaitForCapacity: a run answered 429 is not the result:
// the task goes back and runs again (with a new run number) until it is
// answered.
func TestRefusedRunsWaitForCapacity(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t)
	var mu sync.Mutex
	runs := map[string][]int{}
	later := submit(t, q, "acme", schemas.PriorityNormal, `"later"`)
	e.worker(t, busyExec(&mu, runs))
	st := waitState(t, q, "acme", later.ID)
	if st.Status != Succeeded || st.Runs != 3 || st.Retries != 2 || st.Result == nil || string(st.Result.Body) != `{"answer":42}` {
		t.Fatalf("state %+v, want succeeded on the third run after 2 retries", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(runs[later.ID]) != "[1 2 3]" {
		t.Errorf("run numbers %v, want 1 2 3", runs[later.ID])
	}
}

// TestRefusedPastMaxWaitFails: a task refused until max_wait has passed
// since its submission fails, with the last answer or as expired.
func TestRefusedPastMaxWaitFails(t *testing.T) {
	e := newEnv(t)
	e.cfg.MaxWait = time.Second
	q := e.queue(t)
	var mu sync.Mutex
	busy := submit(t, q, "acme", schemas.PriorityNormal, `"always-busy"`)
	e.worker(t, busyExec(&mu, map[string][]int{}))
	st := waitState(t, q, "acme", busy.ID)
	last429 := st.Result != nil && st.Result.Status == http.StatusTooManyRequests
	if st.Status != Failed || (!last429 && st.ErrorCode != "expired") || st.Finished.Sub(st.Created) < e.cfg.MaxWait-50*time.Millisecond {
		t.Fatalf("always refused: %+v, want failed once max_wait passed (expired, or with the last 429)", st)
	}
	b, _ := json.Marshal(st)
	if !strings.Contains(string(b), `"status":"failed"`) || (last429 && !strings.Contains(string(b), `"result":{"status":429`)) {
		t.Fatalf("wire form %s", b)
	}
}

// TestTaskOutlivesItsWorker: a worker stopped while it runs a task (the
// run is cut at the end of the drain) leaves the task queued, uncommitted;
// a new worker of the group runs it again to its end.
func TestTaskOutlivesItsWorker(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t)
	started := make(chan struct{}, 1)
	stop := e.worker(t, func(ctx context.Context, task *Task, run int) Outcome {
		started <- struct{}{}
		<-ctx.Done() // an upstream that never answers
		return Outcome{}
	})
	task := submit(t, q, "acme", schemas.PriorityHigh, `"survivor"`)
	select {
	case <-started:
	case <-time.After(within):
		t.Fatal("the first worker never ran the task")
	}
	stop()
	if st, ok, _ := q.Get(context.Background(), "acme", task.ID); !ok || st.Status != Queued || st.ErrorCode != "shutdown" {
		t.Fatalf("after the cut: %+v, want queued again", st)
	}
	e.worker(t, func(ctx context.Context, task *Task, run int) Outcome { return ok200(fmt.Sprintf(`{"run":%d}`, run)) })
	st := waitState(t, q, "acme", task.ID)
	if st.Status != Succeeded || string(st.Result.Body) != `{"run":2}` {
		t.Fatalf("state %+v, want succeeded by the second worker's run 2", st)
	}
}
