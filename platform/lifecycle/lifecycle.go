// Package lifecycle runs a group of long-running tasks in one process and
// shuts them all down together: on SIGINT/SIGTERM, or as soon as one of them
// fails, every task's context is cancelled and Run waits for all of them to
// return, up to a grace period.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// Task is one long-running part of the process. It runs until ctx is
// cancelled, finishes its in-flight work, and returns nil on a clean stop.
type Task struct {
	Name string
	Run  func(ctx context.Context) error
}

// Run starts every task and blocks until all have returned. The first task
// error (or a signal) cancels the others; a task still running grace after
// cancellation is abandoned with an error naming it, so a stuck dependency
// cannot hang shutdown forever.
func Run(ctx context.Context, log *slog.Logger, grace time.Duration, tasks ...Task) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := t.Run(ctx)
			if err != nil && !errors.Is(err, context.Canceled) {
				err = fmt.Errorf("%s: %w", t.Name, err)
				log.Error("task failed; stopping the process", "task", t.Name, "err", err)
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel(err)
			}
		}()
	}

	<-ctx.Done()
	log.Info("shutting down", "cause", context.Cause(ctx).Error(), "grace", grace.String())
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(grace):
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("shutdown: tasks still running after %s; abandoning them", grace)
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}
