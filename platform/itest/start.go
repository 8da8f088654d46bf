package itest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Start runs a service's Run function in the background, the way tests
// start a real service in-process, and returns the function that stops it:
// it cancels run's context and waits up to 30 s for it to return, reporting
// an error or a hang as a test error. Stop is idempotent and also runs at
// the test's cleanup, so a test that does not stop the service explicitly
// still leaves nothing running.
func Start(t testing.TB, name string, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop within 30s of cancellation", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
