package itest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform"
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

// StartService starts svc as every host does (platform.Service.Start),
// failing t when it does not serve within a minute, and stops it when the
// test ends (within 30 s, the error it stopped with reported). It returns
// svc, whose Addr is where its API listens.
func StartService(t testing.TB, svc *platform.Service, err error) *platform.Service {
	t.Helper()
	if err != nil {
		t.Fatalf("new service: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := svc.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", svc.Name(), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("%s: %v", svc.Name(), err)
		}
	})
	return svc
}

// RunService runs svc in the background without waiting for it to serve
// (for a test that starts a service whose backing services are down, or
// waits for what it checks anyway), and returns the function that stops it,
// as Start does.
func RunService(t testing.TB, svc *platform.Service, err error) (stop func()) {
	t.Helper()
	if err != nil {
		t.Fatalf("new service: %v", err)
	}
	return Start(t, svc.Name(), svc.Run)
}
