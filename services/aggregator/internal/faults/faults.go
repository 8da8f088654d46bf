// Package faults names the steps of an aggregator flush at which the
// crash tests fail, stop or kill the aggregator (TestFlushFaults, through
// internal/testcmd's -fault flag), so that a test can land a failure on a
// chosen step instead of hoping a kill at a random moment hits it.
//
// Nothing sets a hook in production: each point then costs one atomic
// load and returns nil.
package faults

import (
	"context"
	"sync/atomic"
)

// Step is a point of a flush, named after what is about to happen there.
type Step string

const (
	// Produce: a flush is about to publish its signals and re-routed
	// records (services/aggregator flushAll).
	Produce Step = "produce"
	// Write: a partition's writer is about to insert its batches into
	// ClickHouse (runWriter).
	Write Step = "write"
	// Commit: a partition's writer stored its batches and is about to
	// commit the offset after them (commit).
	Commit Step = "commit"
)

// Hook decides what happens at a step: an error makes the step fail as if
// the broker or ClickHouse had refused it; it may also block, signal its
// own process or exit it.
type Hook func(ctx context.Context, step Step) error

var hook atomic.Pointer[Hook]

// Set installs h (nil removes it). Only test processes call it.
func Set(h Hook) {
	if h == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&h)
}

// At runs the installed hook at step; nil when none is installed.
func At(ctx context.Context, step Step) error {
	if h := hook.Load(); h != nil {
		return (*h)(ctx, step)
	}
	return nil
}
