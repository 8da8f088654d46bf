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
