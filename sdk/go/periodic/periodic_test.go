package periodic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestEveryCallsUntilTheContextEnds: f runs at the interval while ctx
// lives, and never after Every has returned. (A tick that is due as ctx
// ends may still run f once more: select picks either.)
func TestEveryCallsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func() {
			if n.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
	ran := n.Load()
	if ran < 3 {
		t.Fatalf("f ran %d times before Every returned, want at least 3", ran)
	}
	time.Sleep(20 * time.Millisecond)
	if got := n.Load(); got != ran {
		t.Fatalf("f ran %d more times after Every returned", got-ran)
	}
}

// TestEveryWaitsAnIntervalFirst: a context that ends before the first
// interval means f never runs.
func TestEveryWaitsAnIntervalFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	Every(ctx, time.Hour, func() { t.Error("f ran before the first interval") })
}
