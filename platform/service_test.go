package platform

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A started service serves at the address its run reported, and Stop
// cancels it and returns what it stopped with.
func TestServiceStartsServesAndStops(t *testing.T) {
	stopped := errors.New("flushed with one batch lost")
	svc := NewService("x", func(ctx context.Context, ready func(string)) error {
		ready("127.0.0.1:4000")
		<-ctx.Done()
		return stopped
	})
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if svc.Addr() != "127.0.0.1:4000" {
		t.Fatalf("Addr = %q", svc.Addr())
	}
	select {
	case <-svc.Done():
		t.Fatal("done before Stop")
	default:
	}
	if err := svc.Stop(context.Background()); !errors.Is(err, stopped) {
		t.Fatalf("Stop = %v, want the run's error", err)
	}
	if err := svc.Start(context.Background()); err == nil {
		t.Fatal("a second Start succeeded")
	}
}

// A service that cannot start makes Start fail with its error, named.
func TestServiceStartReportsTheRunsError(t *testing.T) {
	svc := NewService("ingest", func(context.Context, func(string)) error { return errors.New("listen: address in use") })
	err := svc.Start(context.Background())
	if err == nil || err.Error() != "ingest: listen: address in use" {
		t.Fatalf("Start = %v", err)
	}
	quiet := NewService("q", func(context.Context, func(string)) error { return nil })
	if err := quiet.Start(context.Background()); !errors.Is(err, ErrStoppedBeforeReady) {
		t.Fatalf("Start = %v, want ErrStoppedBeforeReady", err)
	}
}

// A start that outlasts its context is abandoned and the run stopped; Run
// asked to stop while starting returns nil (a shutdown, not a failure).
func TestServiceStartBoundedByItsContext(t *testing.T) {
	slow := func(ctx context.Context, _ func(string)) error { <-ctx.Done(); return ctx.Err() }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	svc := NewService("slow", slow)
	if err := svc.Start(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v", err)
	}
	<-svc.Done()

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := NewService("slow", slow).Run(ctx); err != nil {
		t.Fatalf("Run cancelled while starting = %v, want nil", err)
	}
}

// Stop before Start is harmless.
func TestServiceStopBeforeStart(t *testing.T) {
	if err := NewService("x", nil).Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
