package deferred

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// A running task is not claimed again — not even by the gateway that
// runs it — without its run's token: the claim used to grant it again to
// the same owner, and the task ran twice at once (two upstream calls,
// billed twice).
func TestRunningTaskIsNotClaimedTwice(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t)
	task := submit(t, q, "acme", schemas.PriorityNormal, `"once"`)
	s := newStore(e.rdb, e.cfg)
	ctx, now := context.Background(), time.Now()
	first, err := s.claim(ctx, task.ID, "gateway-1", newRunToken(), now)
	if err != nil || first.code != claimed || first.run != 1 || first.token == "" {
		t.Fatalf("first claim: %+v %v, want run 1 claimed with a token", first, err)
	}
	for _, owner := range []string{"gateway-1", "gateway-2"} {
		again, err := s.claim(ctx, task.ID, owner, newRunToken(), now.Add(time.Second))
		if err != nil || again.code != leased {
			t.Fatalf("a second claim by %s while run 1 holds the task: %+v %v, want leased", owner, again, err)
		}
	}
	if resent, err := s.claim(ctx, task.ID, "gateway-1", first.token, now.Add(time.Second)); err != nil || resent.code != claimed || resent.run != 1 {
		t.Fatalf("the first claim sent again (its answer lost): %+v %v, want run 1 again", resent, err)
	}
	// Only the run that holds it puts it back.
	if err := s.release(ctx, task.ID, "not-the-token", true, "retrying", ""); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := q.Get(ctx, "acme", task.ID); st.Status != Running {
		t.Fatalf("a release without the run's token changed the task: %+v", st)
	}
	if err := s.release(ctx, task.ID, first.token, true, "retrying", ""); err != nil {
		t.Fatal(err)
	}
	second, err := s.claim(ctx, task.ID, "gateway-1", newRunToken(), now.Add(2*time.Second))
	if err != nil || second.code != claimed || second.run != 2 {
		t.Fatalf("claim after the release: %+v %v, want run 2", second, err)
	}
	// A run whose lease ended (its gateway died) is taken over.
	if late, err := s.claim(ctx, task.ID, "gateway-2", newRunToken(), now.Add(2*time.Second+e.cfg.Lease+time.Second)); err != nil || late.code != claimed || late.run != 3 {
		t.Fatalf("claim past the lease: %+v %v, want run 3", late, err)
	}
}

// A partition taken away while its task runs, and given back, is read
// again from its committed offset: the running task's record comes back.
// The worker must not start it a second time while the first run goes on.
// Four long tasks, one per class topic (one partition each), all running
// on worker A; worker B joins (half the partitions move to it, B cannot
// claim the running tasks), then leaves (they come back to A).
func TestReassignedPartitionDoesNotRunATaskTwice(t *testing.T) {
	e := newEnv(t)
	e.kcfg.Partitions = 1
	e.cfg.Workers = 5 // one free: a record read again could start at once
	q := e.queue(t)
	release := make(chan struct{})
	var mu sync.Mutex
	active, most := map[string]int{}, map[string]int{}
	exec := func(ctx context.Context, task *Task, run int) Outcome {
		mu.Lock()
		active[task.ID]++
		most[task.ID] = max(most[task.ID], active[task.ID])
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
		mu.Lock()
		active[task.ID]--
		mu.Unlock()
		return ok200(`{}`)
	}
	var tasks []*Task
	for _, p := range Classes {
		tasks = append(tasks, submit(t, q, "acme", p, `"long"`))
	}
	a, err := NewWorker(e.cfg, e.kcfg, e.rdb, exec, slog.New(slog.DiscardHandler), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	itest.Start(t, "worker a", a.Run)
	running := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range active {
			n += v
		}
		return n
	}
	itest.Eventually(t, within, "a runs the four tasks", func() bool { return running() == 4 })

	stopB := e.worker(t, func(ctx context.Context, task *Task, run int) Outcome {
		t.Errorf("worker b ran %s, which a runs", task.ID)
		return ok200(`{}`)
	})
	itest.Eventually(t, within, "some partitions moved to b", func() bool { return a.assignedCount() < len(Classes) })
	stopB()
	itest.Eventually(t, within, "the partitions back on a, and a running task's record read again", func() bool {
		mu.Lock()
		twice := false
		for _, n := range most {
			twice = twice || n > 1
		}
		mu.Unlock()
		return twice || a.holdsRunningAgain()
	})
	for id, n := range most {
		if n > 1 {
			t.Errorf("task %s ran %d times at once", id, n)
		}
	}
	close(release)
	for _, task := range tasks {
		if st := waitState(t, q, "acme", task.ID); st.Status != Succeeded || st.Runs != 1 {
			t.Errorf("task %s: %+v, want succeeded after one run", task.ID, st)
		}
	}
}

// Records fetched for a partition that is not assigned (a fetch that
// raced its partition's revocation) are dropped: they must not recreate
// the partition's state, whose commits would move the offsets of a
// partition another gateway now owns.
func TestRecordsOfUnassignedPartitionsAreDropped(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TopicPrefix = "sluice.test.deferred"
	w := &Worker{cfg: cfg, log: slog.New(slog.DiscardHandler), class: map[string]int{}, parts: map[topicPart]*partState{}}
	for i, p := range Classes {
		w.class[cfg.Topic(p)] = i
	}
	topic := cfg.Topic(schemas.PriorityNormal)
	rec := &kgo.Record{Topic: topic, Partition: 2, Offset: 40, Value: []byte(`{"id":"` + NewID() + `","tenant":"acme","api_key_id":"k","endpoint":"/v1/chat/completions","created":"2026-01-01T00:00:00Z"}`)}
	w.add(kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: topic, Partitions: []kgo.FetchPartition{{Partition: 2, Records: []*kgo.Record{rec}}}}}}})
	if len(w.parts) != 0 || len(w.commitsLocked(nil)) != 0 {
		t.Fatalf("a record of an unassigned partition left state %v and commits %v", w.parts, w.commitsLocked(nil))
	}
	for _, b := range w.buf {
		if len(b) != 0 {
			t.Fatal("a record of an unassigned partition was buffered")
		}
	}
}

// assignedCount is how many partitions the group gives w now.
func (w *Worker) assignedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.assigned)
}

// holdsRunningAgain reports whether w buffers the record of a task it
// runs now (read again after its partition came back).
func (w *Worker) holdsRunningAgain() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.buf {
		for _, it := range b {
			if w.running[it.task.ID] {
				return true
			}
		}
	}
	return false
}
