package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestFailingTaskStopsTheOthers(t *testing.T) {
	stopped := make(chan struct{})
	err := Run(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), 10*time.Second,
		Task{Name: "broken", Run: func(context.Context) error { return errors.New("boom") }},
		Task{Name: "healthy", Run: func(ctx context.Context) error { <-ctx.Done(); close(stopped); return nil }},
	)
	if err == nil || !strings.Contains(err.Error(), "broken: boom") {
		t.Fatalf("Run = %v, want the failing task's error named", err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("healthy task was not stopped before Run returned")
	}
}

func TestCancelledParentIsACleanStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Second,
		Task{Name: "a", Run: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }})
	if err != nil {
		t.Fatalf("Run = %v, want nil on a clean stop", err)
	}
}

func TestStuckTaskIsAbandonedAfterGrace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	release := make(chan struct{})
	defer close(release)
	err := Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), 50*time.Millisecond,
		Task{Name: "stuck", Run: func(context.Context) error { <-release; return nil }})
	if err == nil || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("Run = %v, want a shutdown error", err)
	}
}

// TestStopsAfterOrdersTheShutdown: a task that stops after another keeps
// its context until that one has returned, and can still serve it while
// it finishes (the gateway flushing its usage events into ingest).
func TestStopsAfterOrdersTheShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	// Two channels: with one, the gateway could read back its own send.
	events, acks := make(chan struct{}), make(chan struct{})
	var flushedWhileUp bool
	go cancel()
	err := Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), 10*time.Second,
		Task{Name: "ingest", StopsAfter: []string{"gateway"}, Run: func(ctx context.Context) error {
			for {
				select {
				case <-events:
					acks <- struct{}{}
				case <-ctx.Done():
					return nil
				}
			}
		}},
		Task{Name: "gateway", Run: func(ctx context.Context) error {
			<-ctx.Done()
			// Without the order, ingest could be gone and this would wait
			// until the shutdown grace ends.
			select {
			case events <- struct{}{}:
				<-acks
				flushedWhileUp = true
			case <-time.After(5 * time.Second):
			}
			return nil
		}},
	)
	if err != nil || !flushedWhileUp {
		t.Fatalf("Run = %v, gateway's last events acknowledged: %v", err, flushedWhileUp)
	}
}

func TestStopsAfterMustNameTasksWithoutCycles(t *testing.T) {
	noop := func(context.Context) error { return nil }
	for name, tasks := range map[string][]Task{
		`stops after "gatway", which is not a task`: {{Name: "ingest", Run: noop, StopsAfter: []string{"gatway"}}},
		"cycle: [a b a]": {{Name: "a", Run: noop, StopsAfter: []string{"b"}}, {Name: "b", Run: noop, StopsAfter: []string{"a"}}},
	} {
		err := Run(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Second, tasks...)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Run = %v, want an error saying %s", err, name)
		}
	}
}
