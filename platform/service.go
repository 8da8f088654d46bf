package platform

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Service is one Sluice service as every host runs it — `sluice run` and
// `sluice demo` through lifecycle, the tests through itest.StartService:
// its package's New validates the configuration and returns it, Start
// brings it up, Addr is where its API listens, Stop shuts it down
// gracefully. One way to start a service, so that what the tests start is
// what production runs.
type Service struct {
	name string
	run  RunFunc

	mu      sync.Mutex
	started bool
	addr    string
	ready   chan struct{} // closed by the run's ready call
	done    chan struct{} // closed when run has returned
	err     error         // run's error, once done
	cancel  context.CancelFunc
}

// RunFunc is a service's body: it serves until ctx ends, then shuts down
// gracefully and returns. It calls ready once it serves — with the address
// its API listens on, or "" for a service without one — and returns an
// error when it could not start or failed while running.
type RunFunc func(ctx context.Context, ready func(addr string)) error

// NewService returns the service called name that run runs.
func NewService(name string, run RunFunc) *Service {
	return &Service{name: name, run: run, ready: make(chan struct{}), done: make(chan struct{})}
}

// Name is the service's name.
func (s *Service) Name() string { return s.name }

// ErrStoppedBeforeReady is returned by Start when the service ended
// without error before it was ready.
var ErrStoppedBeforeReady = errors.New("the service stopped before it was ready")

// Start runs the service in the background and returns once it serves, or
// with the error that kept it from starting. ctx bounds the start only:
// when it ends first, the service is stopped and Start returns ctx's
// error. A service starts once.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return fmt.Errorf("%s: started twice", s.name)
	}
	s.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	s.mu.Unlock()
	var once sync.Once
	go func() {
		defer close(s.done)
		err := s.run(runCtx, func(addr string) {
			once.Do(func() {
				s.mu.Lock()
				s.addr = addr
				s.mu.Unlock()
				close(s.ready)
			})
		})
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}()
	select {
	case <-s.ready:
		return nil
	case <-s.done:
		if err := s.Err(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		return fmt.Errorf("%s: %w", s.name, ErrStoppedBeforeReady)
	case <-ctx.Done():
		cancel()
		<-s.done
		return fmt.Errorf("%s: start: %w", s.name, ctx.Err())
	}
}

// Addr is the address the service's API listens on ("" before it is
// ready, and for a service without one).
func (s *Service) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Done is closed once the service has stopped, asked to or not.
func (s *Service) Done() <-chan struct{} { return s.done }

// Err is the error the service stopped with (nil while it runs).
func (s *Service) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stop asks the service to shut down and waits until it has, or until ctx
// ends; it returns the error the service stopped with. Stopping a service
// that never started, or stopping twice, is harmless.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	cancel := s.cancel
	s.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-s.done:
		return s.Err()
	case <-ctx.Done():
		return fmt.Errorf("%s did not stop: %w", s.name, ctx.Err())
	}
}

// Run starts the service, keeps it running until ctx ends or it stops on
// its own, then stops it and returns its error: the shape of a
// lifecycle.Task, whose shutdown grace bounds the stop.
func (s *Service) Run(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil // asked to stop while starting
		}
		return err
	}
	select {
	case <-ctx.Done():
	case <-s.done:
	}
	return s.Stop(context.Background())
}
