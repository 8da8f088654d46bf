package ops

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReadyzNamesFailingCheck(t *testing.T) {
	h := NewHealth()
	h.AddReadiness("kafka", func(context.Context) error { return nil })
	srv := httptest.NewServer(Handler(NewRegistry(), h))
	defer srv.Close()

	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with passing checks = %d, want 200", code)
	}
	h.AddReadiness("clickhouse", func(context.Context) error { return errors.New("connection refused") })
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "clickhouse: connection refused") {
		t.Fatalf("/readyz = %d %q, want 503 naming clickhouse", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz must not depend on readiness checks, got %d", code)
	}
	if code, body := get("/metrics"); code != http.StatusOK || body == "" {
		t.Fatalf("/metrics = %d", code)
	}
}

func TestExpectedServiceIsNotReadyUntilItReports(t *testing.T) {
	h := NewHealth()
	h.Expect("ingest")
	if failed := h.Ready(context.Background()); failed["ingest"] == nil {
		t.Fatalf("an expected service without checks must make the process unready, got %v", failed)
	}
	h.AddReadiness("ingest-kafka", func(context.Context) error { return nil })
	if failed := h.Ready(context.Background()); len(failed) != 0 {
		t.Fatalf("after the service's first check: %v", failed)
	}
}

func TestProfilerOnlyWhenAsked(t *testing.T) {
	plain := httptest.NewServer(Handler(NewRegistry(), NewHealth()))
	defer plain.Close()
	profiled := httptest.NewServer(WithProfiler(Handler(NewRegistry(), NewHealth())))
	defer profiled.Close()
	status := func(url string) int {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := status(plain.URL + "/debug/pprof/heap"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/heap without ops.pprof = %d, want 404", code)
	}
	if code := status(profiled.URL + "/debug/pprof/heap"); code != http.StatusOK {
		t.Fatalf("/debug/pprof/heap with ops.pprof = %d, want 200", code)
	}
	if code := status(profiled.URL + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz behind the profiler = %d, want 200", code)
	}
}
