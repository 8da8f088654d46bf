// Package ops serves a process's operational HTTP endpoints: Prometheus
// metrics on /metrics, liveness on /healthz and readiness on /readyz, and,
// when ops.pprof is on, the Go profiler on /debug/pprof/ (CPU and heap
// profiles of a service under its real load; off by default, because a
// profile exposes the process's internals to whoever reaches the port).
//
// Liveness says the process is running and not wedged; it never checks
// dependencies, so an orchestrator does not restart a healthy process
// because Kafka is down. Readiness runs every registered check (is Kafka
// reachable, has the consumer caught up, ...) and answers 503 naming the
// failing ones, so a load balancer stops sending work.
package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/platform/httpserver"
)

// Config says where the operational endpoints listen.
type Config struct {
	Listen string              `yaml:"listen" help:"address of /metrics, /healthz and /readyz"`
	HTTP   httpserver.Timeouts `yaml:"http"`
	// Pprof serves Go's profiler on the same address: for measuring a
	// service under load, not for an address others can reach.
	Pprof bool `yaml:"pprof" help:"also serve the Go profiler on /debug/pprof/ (CPU, heap, allocations); only on a listen address nobody else reaches"`
}

// Defaults listens on loopback port 9464 with httpserver's timeouts.
func Defaults() Config { return Config{Listen: "127.0.0.1:9464", HTTP: httpserver.Defaults()} }

// Validate checks the listen address and the timeouts.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("ops.listen: %q is not host:port: %w", c.Listen, err))
	}
	if err := c.HTTP.Validate("ops.http"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Check reports whether one dependency is usable. It must honour ctx.
type Check func(ctx context.Context) error

// Health holds the readiness checks of every service in the process.
type Health struct {
	mu       sync.RWMutex
	checks   map[string]Check
	expected map[string]struct{} // services started but not yet reporting
}

// NewHealth returns an empty set of checks: ready until something is added
// or expected.
func NewHealth() *Health { return &Health{checks: map[string]Check{}, expected: map[string]struct{}{}} }

// Expect marks a service the host is starting: the process is not ready
// until that service registers a check of its own (named service or
// "service-..."), so /readyz cannot answer 200 in the moment between the
// operational endpoints coming up and the service's first check.
func (h *Health) Expect(service string) {
	h.mu.Lock()
	h.expected[service] = struct{}{}
	h.mu.Unlock()
}

// AddReadiness registers a named check; a later call with the same name
// replaces it.
func (h *Health) AddReadiness(name string, c Check) {
	h.mu.Lock()
	h.checks[name] = c
	for svc := range h.expected {
		if name == svc || strings.HasPrefix(name, svc+"-") {
			delete(h.expected, svc)
		}
	}
	h.mu.Unlock()
}

// RemoveReadiness drops a check, for a service that stopped.
func (h *Health) RemoveReadiness(name string) {
	h.mu.Lock()
	delete(h.checks, name)
	h.mu.Unlock()
}

// Ready runs every check concurrently and returns the failures by name.
func (h *Health) Ready(ctx context.Context) map[string]error {
	var (
		mu     sync.Mutex
		failed = map[string]error{}
		wg     sync.WaitGroup
	)
	h.mu.RLock()
	checks := make(map[string]Check, len(h.checks))
	for n, c := range h.checks {
		checks[n] = c
	}
	for svc := range h.expected {
		failed[svc] = errors.New("starting")
	}
	h.mu.RUnlock()

	for name, check := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := check(ctx); err != nil {
				mu.Lock()
				failed[name] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

// NewRegistry returns a registry with the Go runtime and process collectors,
// the base every Sluice process exports.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Handler returns the mux serving /metrics, /healthz and /readyz.
func Handler(reg prometheus.Gatherer, h *Health) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		failed := h.Ready(ctx)
		if len(failed) == 0 {
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		names := make([]string, 0, len(failed))
		for n := range failed {
			names = append(names, n)
		}
		sort.Strings(names)
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, "not ready: %s: %v\n", n, failed[n])
		}
		http.Error(w, strings.TrimSuffix(b.String(), "\n"), http.StatusServiceUnavailable)
	})
	return mux
}

// Serve runs the operational endpoints on cfg.Listen until ctx ends, then
// shuts the server down within a few seconds.
func Serve(ctx context.Context, cfg Config, reg prometheus.Gatherer, h *Health, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("ops: listen on %s: %w (set -ops.listen to a free address)", cfg.Listen, err)
	}
	handler := Handler(reg, h)
	if cfg.Pprof {
		handler = WithProfiler(handler)
		log.Warn("the Go profiler is served on the operational address (ops.pprof)", "addr", ln.Addr().String())
	}
	return serve(ctx, ln, handler, cfg.HTTP, log)
}

// ServeListener is Serve on a listener the caller opened; it closes ln.
func ServeListener(ctx context.Context, ln net.Listener, t httpserver.Timeouts, reg prometheus.Gatherer, h *Health, log *slog.Logger) error {
	return serve(ctx, ln, Handler(reg, h), t, log)
}

// WithProfiler adds Go's profiler under /debug/pprof/ to next.
func WithProfiler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

func serve(ctx context.Context, ln net.Listener, handler http.Handler, t httpserver.Timeouts, log *slog.Logger) error {
	srv := httpserver.New(handler, t, log)
	log.Info("operational endpoints listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
