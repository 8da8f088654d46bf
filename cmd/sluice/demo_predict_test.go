package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestDemoShowsTheRunawaysPredictionEarly runs the demo as `make run`
// does — the whole pipeline, `sluice gateway`, the mock upstream, the
// load and the live view — with the demo's runaway alone, on the real
// services under unique names. The runaway (12 calls a second) uses its
// 500,000-token hour in about 80 s. The live view must show its predicted
// exhaustion before it has made 180 calls (15 s at its pace), and the
// predictive alert must fire before 90% of the quota is used; the view's
// own notes report both, as `make run` prints them.
//
// Alertmanager is a recorder here: the shared one may hold alerts of
// another run's tenant "runaway".
func TestDemoShowsTheRunawaysPredictionEarly(t *testing.T) {
	kc, rc, ch := itest.Kafka(t), itest.Redis(t), itest.ClickHouse(t)
	am := newAlertRecorder()
	amSrv := httptest.NewServer(am)
	t.Cleanup(amSrv.Close)

	cfg := demoConfig()
	cfg.Kafka, cfg.Redis, cfg.ClickHouse = kc, rc, ch
	cfg.Policy.File = demoPolicyAwayFromTheHourEnd(t, time.Now())
	cfg.Ops.Listen = freeAddr(t)
	sv := &cfg.Services
	cfg.Redis.KeyPrefix = itest.Unique(t, "demopredict") + ":"
	cfg.Topics = itest.Topics(t)
	sv.Ingest.Listen = freeAddr(t)
	sv.Aggregator.Group = itest.Unique(t, "demo_agg")
	sv.Enforcer.Group = itest.Unique(t, "demo_enf")
	sv.Enforcer.Admin.Listen = freeAddr(t)
	sv.Alerter.Group, sv.Alerter.Alertmanager.URL = itest.Unique(t, "demo_alerter"), amSrv.URL
	sv.Gateway.Deferred.Group, sv.Gateway.Deferred.TopicPrefix = itest.Unique(t, "demo_deferred"), itest.Unique(t, "demo_deferred")
	sv.Console.Listen = freeAddr(t)

	var out itest.Buffer
	d := newDemoRun(freeAddr(t), freeAddr(t), demoTenants[:1], &out, false)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = d.run(ctx, &cfg, log); close(done) }()
	t.Cleanup(func() {
		stop()
		<-done
		if runErr != nil {
			t.Errorf("demo: %v", runErr)
		}
		t.Logf("the demo's output:\n%s", out.String())
	})

	itest.EventuallyNoError(t, 3*time.Minute, "the predictive alert shows in the live view", func() error {
		select {
		case <-done:
			t.Fatalf("the demo stopped: %v", runErr)
		default:
		}
		if _, ok := d.milestones.Alerted(); !ok {
			return errNotYet("no predictive alert in the view yet")
		}
		return nil
	})
	p, ok := d.milestones.Prediction()
	a, _ := d.milestones.Alerted()
	t.Logf("first prediction shown %.1f s after the runaway's first call, after %d calls, at %.1f%% used (%s); alert %s at %.1f%% used, %.1f s",
		p.After.Seconds(), p.Calls, p.UsedPercent, p.What, a.What, a.UsedPercent, a.After.Seconds())
	if !ok || p.Calls >= 180 || p.UsedPercent <= 0 {
		t.Errorf("the runaway's first prediction was shown after %d calls (%.1f%% used), want before 180 (15 s of its 12 a second)", p.Calls, p.UsedPercent)
	}
	if !strings.Contains(p.What, "rates") {
		t.Errorf("the first prediction %q does not rest on the early rates", p.What)
	}
	if a.UsedPercent >= 90 || a.UsedPercent < p.UsedPercent {
		t.Errorf("the predictive alert fired at %.1f%% used (first prediction at %.1f%%), want after the prediction and before 90%%", a.UsedPercent, p.UsedPercent)
	}
	itest.EventuallyNoError(t, 30*time.Second, "the demo's output reports both", func() error {
		s := out.String()
		for _, want := range []string{"runaway: first prediction shown ", "runaway: predictive alert SluiceQuotaExhaustionPredicted/"} {
			if !strings.Contains(s, want) {
				return errNotYet("the output lacks " + want)
			}
		}
		return nil
	})
}

// demoPolicyAwayFromTheHourEnd writes the demo's policy with the runaway's
// time zone chosen so that its hourly quota's period does not end during
// the run: near the end of a UTC hour the period would reset before the
// runaway could exhaust it, and rightly no prediction would show. From
// minute 45 on, the runaway's hours follow Asia/Kolkata (UTC+05:30), whose
// hours end at half past UTC's.
func demoPolicyAwayFromTheHourEnd(t *testing.T, now time.Time) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "demo", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	zone := "UTC"
	if now.UTC().Minute() >= 45 {
		zone = "Asia/Kolkata"
	}
	const runaway = "  runaway:\n    plan: starter\n"
	if !bytes.Contains(raw, []byte(runaway)) {
		t.Fatalf("deploy/demo/policy.yaml no longer declares the runaway as %q", runaway)
	}
	raw = bytes.Replace(raw, []byte(runaway), []byte(runaway+"    timezone: "+zone+"\n"), 1)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }

// alertRecorder is the part of Alertmanager's API v2 the demo uses: the
// alerter posts alerts, the live view lists the active ones.
type alertRecorder struct {
	mu     sync.Mutex
	alerts map[string]json.RawMessage // by label set
	ends   map[string]time.Time
}

func newAlertRecorder() *alertRecorder {
	return &alertRecorder{alerts: map[string]json.RawMessage{}, ends: map[string]time.Time{}}
}

func (a *alertRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v2/alerts" {
		http.NotFound(w, r)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.Method {
	case http.MethodPost:
		var list []json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&list); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, raw := range list {
			var al struct {
				Labels map[string]string `json:"labels"`
				EndsAt time.Time         `json:"endsAt"`
			}
			if err := json.Unmarshal(raw, &al); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			keys := make([]string, 0, len(al.Labels))
			for k, v := range al.Labels {
				keys = append(keys, k+"="+v)
			}
			sort.Strings(keys)
			id := strings.Join(keys, ",")
			a.alerts[id], a.ends[id] = raw, al.EndsAt
		}
	case http.MethodGet:
		active := []json.RawMessage{}
		for id, raw := range a.alerts {
			if e := a.ends[id]; e.IsZero() || e.After(time.Now()) {
				active = append(active, raw)
			}
		}
		_ = json.NewEncoder(w).Encode(active)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}
