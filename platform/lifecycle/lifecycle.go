// Package lifecycle runs a group of long-running tasks in one process and
// shuts them all down together: on SIGINT/SIGTERM, or as soon as one of them
// fails, every task's context is cancelled and Run waits for all of them to
// return, up to a grace period. A task may ask to be stopped only after
// others have returned (Task.StopsAfter), so that a service keeps serving
// the ones that depend on it while they finish.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Task is one long-running part of the process. It runs until ctx is
// cancelled, finishes its in-flight work, and returns nil on a clean stop.
type Task struct {
	Name string
	Run  func(ctx context.Context) error
	// StopsAfter names tasks of the same Run that must have returned
	// before this task's context is cancelled at shutdown. Ingest stops
	// after a gateway in the same process, for example, so that the
	// gateway's last usage events, flushed as it stops, are still
	// accepted. Every task still shares the one grace period.
	StopsAfter []string
}

// OnStopSignal returns a context cancelled at SIGINT or SIGTERM, as Run's
// is. A command takes it before its start-up work (waiting for ClickHouse,
// migrating, connecting), so that a stop signal then ends the start-up
// through its context, with an error that says so, instead of killing the
// process by the signal's default action (exit 143, nothing logged).
func OnStopSignal(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// Run starts every task and blocks until all have returned. The first task
// error (or a signal) starts the shutdown: each task's context is cancelled
// once the tasks it StopsAfter have returned, at once for the others. A
// task still running grace after the shutdown began is abandoned with an
// error naming it, so a stuck dependency cannot hang shutdown forever.
// Two tasks of one name, StopsAfter naming an unknown task, or a cycle is
// an error before any task starts.
func Run(ctx context.Context, log *slog.Logger, grace time.Duration, tasks ...Task) error {
	if err := checkOrder(tasks); err != nil {
		return err
	}
	ctx, stop := OnStopSignal(ctx)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		first   error
		running = map[string]bool{}
	)
	done := make(map[string]chan struct{}, len(tasks))
	for _, t := range tasks {
		done[t.Name] = make(chan struct{})
		running[t.Name] = true
	}
	cancels := make([]context.CancelCauseFunc, len(tasks))
	for i, t := range tasks {
		// Each task's context outlives the shared one until its turn.
		tctx, tcancel := context.WithCancelCause(context.WithoutCancel(ctx))
		cancels[i] = tcancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(done[t.Name])
			err := t.Run(tctx)
			mu.Lock()
			delete(running, t.Name)
			mu.Unlock()
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
	defer func() {
		for _, c := range cancels {
			c(nil)
		}
	}()

	<-ctx.Done()
	cause := context.Cause(ctx)
	log.Info("shutting down", "cause", cause.Error(), "grace", grace.String())
	for i, t := range tasks {
		go func() {
			for _, n := range t.StopsAfter {
				<-done[n]
			}
			cancels[i](cause)
		}()
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-all:
	case <-timer.C:
		mu.Lock()
		defer mu.Unlock()
		names := make([]string, 0, len(running))
		for n := range running {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Errorf("shutdown: tasks still running after %s: %v; abandoning them", grace, names)
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// checkOrder refuses StopsAfter names that are not tasks and cycles, which
// would hold their tasks until the grace period ran out.
func checkOrder(tasks []Task) error {
	byName := make(map[string]*Task, len(tasks))
	for i := range tasks {
		if byName[tasks[i].Name] != nil {
			return fmt.Errorf("lifecycle: two tasks are named %q", tasks[i].Name)
		}
		byName[tasks[i].Name] = &tasks[i]
	}
	for _, t := range tasks {
		for _, n := range t.StopsAfter {
			if byName[n] == nil {
				return fmt.Errorf("lifecycle: task %s stops after %q, which is not a task of this process", t.Name, n)
			}
		}
	}
	const (
		unvisited = iota
		visiting
		visited
	)
	state := map[string]int{}
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		switch state[name] {
		case visiting:
			return fmt.Errorf("lifecycle: tasks stop after each other in a cycle: %v", append(path, name))
		case visited:
			return nil
		}
		state[name] = visiting
		for _, n := range byName[name].StopsAfter {
			if err := visit(n, append(path, name)); err != nil {
				return err
			}
		}
		state[name] = visited
		return nil
	}
	for _, t := range tasks {
		if err := visit(t.Name, nil); err != nil {
			return err
		}
	}
	return nil
}
