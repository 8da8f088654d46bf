package emitter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/schemas/framing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func event(id string) *schemas.UsageEvent {
	return &schemas.UsageEvent{ID: id, Time: time.Now().UTC(), Tenant: "acme", Model: "gpt-4o", PromptTokens: 10, CompletionTokens: 2}
}

// fakeSender records deliveries and fails on demand.
type fakeSender struct {
	mu        sync.Mutex
	delivered map[string]int
	failures  int           // attempts to fail before succeeding
	gate      chan struct{} // when set, Send waits for it
	calls     atomic.Int64
}

func (f *fakeSender) Send(ctx context.Context, events []schemas.UsageEvent) ([]Rejection, error) {
	f.calls.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures > 0 {
		f.failures--
		return nil, &RetryError{Err: errors.New("broker down")}
	}
	if f.delivered == nil {
		f.delivered = map[string]int{}
	}
	for i := range events {
		f.delivered[events[i].ID]++
	}
	return nil, nil
}

func newEmitter(t *testing.T, s Sender, edit func(*Config)) (*Emitter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Logger: quiet, Registerer: reg, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, FlushInterval: 10 * time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	e, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, reg
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestFlushDeliversEverythingAcrossFailures(t *testing.T) {
	f := &fakeSender{failures: 5}
	e, _ := newEmitter(t, f, func(c *Config) { c.BatchSize = 100 })
	for i := range 2500 {
		if err := e.Emit(event(fmt.Sprint("e-", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Flush(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.delivered) != 2500 {
		t.Fatalf("delivered %d distinct events, want 2500", len(f.delivered))
	}
	for id, n := range f.delivered {
		if n != 1 {
			t.Fatalf("%s delivered %d times", id, n)
		}
	}
}

func TestFullBufferDropsNewestCountedAndReported(t *testing.T) {
	f := &fakeSender{gate: make(chan struct{})}
	e, reg := newEmitter(t, f, func(c *Config) { c.MaxBufferedEvents = 10; c.BatchSize = 5 })
	for i := range 10 {
		if err := e.Emit(event(fmt.Sprint("k-", i))); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	for i := range 3 {
		if err := e.Emit(event(fmt.Sprint("drop-", i))); !errors.Is(err, ErrBufferFull) {
			t.Fatalf("event over the bound: err = %v, want ErrBufferFull", err)
		}
	}
	if got := testutil.ToFloat64(e.m.dropped.WithLabelValues("buffer_full")); got != 3 {
		t.Fatalf("dropped{buffer_full} = %v, want 3", got)
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_emitter_dropped_events_total"); err != nil || n == 0 {
		t.Fatalf("drop metric not registered: %d %v", n, err)
	}
	close(f.gate)
	if err := e.Flush(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.delivered) != 10 || f.delivered["drop-0"] != 0 || f.delivered["k-0"] != 1 {
		t.Fatalf("delivered %v: want exactly the 10 buffered events (newest dropped)", f.delivered)
	}
}

func TestByteBound(t *testing.T) {
	f := &fakeSender{gate: make(chan struct{})}
	defer close(f.gate)
	e, _ := newEmitter(t, f, func(c *Config) { c.MaxBufferedBytes = 4096 })
	accepted := 0
	for i := range 100 {
		if e.Emit(event(fmt.Sprint("b-", i))) == nil {
			accepted++
		}
	}
	if accepted == 0 || accepted >= 100 || int64(accepted)*estimate(event("b-00")) > 4096 {
		t.Fatalf("accepted %d events under a 4096-byte bound", accepted)
	}
}

func TestInvalidEventRefusedAtEmit(t *testing.T) {
	e, _ := newEmitter(t, &fakeSender{}, nil)
	ev := event("x")
	ev.PromptTokens = -1
	var ve schemas.ValidationError
	if err := e.Emit(ev); !errors.As(err, &ve) || !ve.Has("prompt_tokens") {
		t.Fatalf("err = %v, want a ValidationError naming prompt_tokens", err)
	}
}

func TestCloseDeliversThenRefuses(t *testing.T) {
	f := &fakeSender{failures: 2}
	e, _ := newEmitter(t, f, func(c *Config) { c.FlushInterval = time.Hour })
	for i := range 7 {
		e.Emit(event(fmt.Sprint("c-", i)))
	}
	if err := e.Close(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if len(f.delivered) != 7 {
		t.Fatalf("Close delivered %d of 7", len(f.delivered))
	}
	if err := e.Emit(event("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Emit after Close: %v", err)
	}
}

func TestCloseDeadlineCountsLostEvents(t *testing.T) {
	f := &fakeSender{failures: 1 << 30}
	e, _ := newEmitter(t, f, nil)
	for i := range 4 {
		e.Emit(event(fmt.Sprint("l-", i)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Give up once the emitter has tried at least twice.
		for f.calls.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	err := e.Close(ctx)
	if err == nil || testutil.ToFloat64(e.m.dropped.WithLabelValues("closed")) != 4 {
		t.Fatalf("Close = %v, dropped{closed} = %v; want an error and 4", err, testutil.ToFloat64(e.m.dropped.WithLabelValues("closed")))
	}
}

func TestBackoffIsFullJitterCapped(t *testing.T) {
	for attempt := range 40 {
		ceil := min(time.Second, 10*time.Millisecond<<min(attempt, 20))
		for range 50 {
			if d := backoff(attempt, 10*time.Millisecond, time.Second); d < 0 || d >= ceil {
				t.Fatalf("attempt %d: %s outside [0, %s)", attempt, d, ceil)
			}
		}
	}
}

func TestHTTPSenderRetriesAndDropsRejected(t *testing.T) {
	var calls atomic.Int64
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" || r.URL.Path != "/v1/events" {
			http.Error(w, `{"error":"bad"}`, http.StatusUnauthorized)
			return
		}
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			w.Write([]byte(`{"error":"broker down"}`))
			return
		}
		body, _ := io.ReadAll(r.Body)
		var evs []schemas.UsageEvent
		mu.Lock()
		framing.SplitJSONArray(body, func(_ int, raw []byte) error {
			var ev schemas.UsageEvent
			if err := eventjson.DecodeUsageEvent(raw, &ev); err == nil && ev.ID != "h-1" {
				got[ev.ID]++
			}
			evs = append(evs, ev)
			return nil
		})
		mu.Unlock()
		w.WriteHeader(207)
		fmt.Fprintf(w, `{"accepted":%d,"rejected":[{"index":1,"id":"h-1","errors":[{"field":"tenant","reason":"no"}]}]}`, len(evs)-1)
	}))
	defer srv.Close()
	e, _ := newEmitter(t, &HTTPSender{URL: srv.URL, APIKey: "k", Gzip: false}, nil)
	for i := range 3 {
		e.Emit(event(fmt.Sprint("h-", i)))
	}
	if err := e.Flush(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || got["h-0"] != 1 || got["h-2"] != 1 {
		t.Fatalf("calls=%d got=%v: want one 503 then one delivery of h-0 and h-2", calls.Load(), got)
	}
	if d := testutil.ToFloat64(e.m.dropped.WithLabelValues("rejected")); d != 1 {
		t.Fatalf("dropped{rejected} = %v, want 1", d)
	}
}

// TestHTTPSender413SplitsBatch: an ingest that refuses batches of more than
// three events with 413 still receives every event exactly once, in
// smaller batches, and nothing is counted as dropped.
func TestHTTPSender413SplitsBatch(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ids []string
		framing.SplitJSONArray(body, func(_ int, raw []byte) error {
			var ev schemas.UsageEvent
			if err := eventjson.DecodeUsageEvent(raw, &ev); err == nil {
				ids = append(ids, ev.ID)
			}
			return nil
		})
		if len(ids) > 3 {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			fmt.Fprintf(w, `{"error":"request carries %d events; max_events_per_request is 3"}`, len(ids))
			return
		}
		mu.Lock()
		for _, id := range ids {
			got[id]++
		}
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"accepted":%d,"rejected":[]}`, len(ids))
	}))
	defer srv.Close()
	e, _ := newEmitter(t, &HTTPSender{URL: srv.URL}, func(c *Config) { c.FlushInterval = time.Hour })
	for i := range 13 {
		if err := e.Emit(event(fmt.Sprint("big-", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Flush(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range 13 {
		if id := fmt.Sprint("big-", i); got[id] != 1 {
			t.Errorf("%s delivered %d times, want 1 (got %v)", id, got[id], got)
		}
	}
	for _, r := range []string{"refused", "too_large", "rejected"} {
		if d := testutil.ToFloat64(e.m.dropped.WithLabelValues(r)); d != 0 {
			t.Errorf("dropped{%s} = %v, want 0", r, d)
		}
	}
	if d := testutil.ToFloat64(e.m.delivered); d != 13 {
		t.Errorf("delivered = %v, want 13", d)
	}
}

// TestHTTPSender413SingleEventDropped: an event refused on its own for its
// size is dropped and counted as too_large, not retried for ever.
func TestHTTPSender413SingleEventDropped(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		w.Write([]byte(`{"error":"body too large"}`))
	}))
	defer srv.Close()
	e, _ := newEmitter(t, &HTTPSender{URL: srv.URL}, nil)
	e.Emit(event("huge-1"))
	e.Emit(event("huge-2"))
	if err := e.Flush(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if d := testutil.ToFloat64(e.m.dropped.WithLabelValues("too_large")); d != 2 {
		t.Fatalf("dropped{too_large} = %v, want 2", d)
	}
}

// TestHTTPSenderOnlyAcceptedCounts: an empty 200 (what a cancelled ingest
// request used to produce, or a proxy) does not acknowledge events: they
// are sent again until a 202 comes.
func TestHTTPSenderOnlyAcceptedCounts(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			return // implicit empty 200
		}
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte(`{"accepted":1,"rejected":[]}`))
	}))
	defer srv.Close()
	e, _ := newEmitter(t, &HTTPSender{URL: srv.URL}, nil)
	e.Emit(event("ok-1"))
	if err := e.Flush(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d requests, want 2: the empty 200 must be retried", n)
	}
	if r := testutil.ToFloat64(e.m.retries); r != 1 {
		t.Fatalf("retries = %v, want 1", r)
	}
}
