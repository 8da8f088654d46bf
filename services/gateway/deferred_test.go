package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/services/gateway/deferred"
)

// deferredConfig is cfg with deferred requests on, on this test's own
// topics, group and Redis prefixes.
func deferredConfig(t *testing.T, cfg testGateway) testGateway {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	cfg.Listen = "127.0.0.1:0"
	cfg.ShutdownTimeout = 2 * time.Second
	cfg.Deferred.Enabled = true
	cfg.Deferred.TopicPrefix = itest.Unique(t, "gw_deferred_")
	cfg.Deferred.Group = itest.Unique(t, "gw_deferred_group_")
	cfg.Deferred.KeyPrefix = itest.Unique(t, "sluice:test:") + ":"
	cfg.Deferred.Workers = 1
	cfg.Deferred.Drain = 200 * time.Millisecond
	t.Cleanup(func() {
		rdb := redisconn.NewClient(itest.Redis(t))
		defer rdb.Close()
		for _, k := range rdb.Keys(context.Background(), cfg.Deferred.KeyPrefix+"*").Val() {
			rdb.Del(context.Background(), k)
		}
	})
	return cfg
}

// runGateway runs `sluice gateway` with cfg in front of upstream until the
// returned stop is called; it returns its URL.
func runGateway(t *testing.T, cfg testGateway, upstream string) (url string, stop func()) {
	t.Helper()
	cfg.ups = []Upstream{{Name: "mock", BaseURL: upstream + "/v1", Models: []string{"*"}}}
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(),
		Redis: itest.Redis(t), Kafka: itest.Kafka(t), TenantKeys: platform.FileSource{File: writeKeys(t), Reload: time.Second},
		Policy: platform.FileSource{File: cfg.writePolicy(t), Reload: time.Second}}
	svc, err := New(cfg.Config, env)
	itest.StartService(t, svc, err)
	return "http://" + svc.Addr(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("gateway: %v", err)
		}
	}
}

// getTask reads a task's state through GET /v1/tasks/{id}.
func getTask(t *testing.T, url, key, id string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/v1/tasks/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// submitTask posts body deferred and returns the task id from the 202.
func submitTask(t *testing.T, url, key, body string, header ...string) string {
	t.Helper()
	resp, b := post(t, url, "/v1/chat/completions", key, body, append([]string{"Prefer", "respond-async"}, header...)...)
	var st map[string]any
	_ = json.Unmarshal([]byte(b), &st)
	id, _ := st["id"].(string)
	if resp.StatusCode != http.StatusAccepted || st["status"] != "queued" || resp.Header.Get("Location") != "/v1/tasks/"+id ||
		resp.Header.Get("Preference-Applied") != "respond-async" {
		t.Fatalf("deferred POST: %d %v %s; want 202, queued, Location /v1/tasks/<id>", resp.StatusCode, resp.Header, b)
	}
	return id
}

// TestDeferredTaskOutlivesAGatewayRestart: gateway 1 accepts two deferred
// requests; its one worker is inside the first (an upstream that does not
// answer) and the second has not run, when gateway 1 stops. Gateway 2, a
// new process of the same fleet in front of a working upstream, runs
// both: GET answers each one's result, the upstream's answer, and the
// first's second run. Another tenant's key sees neither.
func TestDeferredTaskOutlivesAGatewayRestart(t *testing.T) {
	cfg := deferredConfig(t, testConfig(t))
	var held atomic.Int64
	gone := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held.Add(1)
		select {
		case <-r.Context().Done():
		case <-gone:
		}
	}))
	t.Cleanup(stuck.Close)
	t.Cleanup(func() { close(gone) })
	url1, stop1 := runGateway(t, cfg, stuck.URL)
	body := `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"later"}]}`
	first := submitTask(t, url1, "sk-acme", body)
	itest.Eventually(t, time.Minute, "the first task at the upstream", func() bool { return held.Load() == 1 })
	second := submitTask(t, url1, "sk-acme", body)
	if code, st := getTask(t, url1, "sk-acme", second); code != http.StatusOK || st["status"] != "queued" {
		t.Fatalf("second task before the restart: %d %v, want queued", code, st)
	}
	stop1()

	good := mock(t, mockllm.Options{})
	url2, _ := runGateway(t, cfg, strings.TrimSuffix(good, "/v1"))
	for _, id := range []string{first, second} {
		var st map[string]any
		itest.EventuallyNoError(t, time.Minute, "task "+id+" done through gateway 2", func() error {
			var code int
			code, st = getTask(t, url2, "sk-acme", id)
			if code != http.StatusOK || st["status"] != "succeeded" {
				return fmt.Errorf("%d %v", code, st)
			}
			return nil
		})
		res, _ := st["result"].(map[string]any)
		answer, _ := res["body"].(map[string]any)
		if res["status"] != float64(200) || answer["object"] != "chat.completion" {
			t.Fatalf("task %s: result %v, want the upstream's chat completion", id, st["result"])
		}
		if id == first && st["runs"] != float64(2) {
			t.Fatalf("first task: %v runs, want 2 (cut at the restart, run again)", st["runs"])
		}
	}
	if code, _ := getTask(t, url2, "sk-mini-only", first); code != http.StatusNotFound {
		t.Fatalf("another tenant's key read the task: %d", code)
	}
}

// deferredGateway starts a gateway of cfg (deferredConfig) with deps and
// a deferred task queue, and returns it with a worker running its tasks,
// for the caller to start when the test wants tasks to run.
func deferredGateway(t *testing.T, cfg testGateway, deps Deps) (*gw, *deferred.Worker) {
	t.Helper()
	rdb := redisconn.NewClient(itest.Redis(t))
	t.Cleanup(func() { rdb.Close() })
	q, err := deferred.NewQueue(context.Background(), cfg.Deferred, itest.Kafka(t), rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	deps.Tasks = q
	g := startGateway(t, cfg, deps)
	w, err := deferred.NewWorker(cfg.Deferred, itest.Kafka(t), rdb, func(ctx context.Context, task *deferred.Task, run int) deferred.Outcome {
		return g.RunTask(ctx, task, run, cfg.Deferred.MaxResultBytes)
	}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return g, w
}

// TestDeferredRunsThroughTheRequestPath: a deferred request is checked
// like any other before it is queued (stream refused, a key's model
// rules, the priority header), runs with the key's tenant, priority and
// the event id <task>-<run>, and is metered as an ordinary call.
func TestDeferredRunsThroughTheRequestPath(t *testing.T) {
	cfg := deferredConfig(t, oneUpstream(t, mock(t, mockllm.Options{})))
	g, w := deferredGateway(t, cfg, Deps{})
	itest.Start(t, "deferred worker", w.Run)

	stream := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"x"}]}`
	if resp, b := post(t, g.url, "/v1/chat/completions", "sk-acme", stream, "Prefer", "respond-async"); resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, "deferred_stream") {
		t.Fatalf("deferred stream: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, g.url, "/v1/chat/completions", "sk-mini-only", `{"model":"gpt-4o","messages":[]}`, "Prefer", "respond-async"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("deferred call of a model the key may not use: %d %s", resp.StatusCode, b)
	}
	id := submitTask(t, g.url, "sk-boss", `{"model":"gpt-4o","max_tokens":7,"messages":[{"role":"user","content":"deferred"}]}`, "X-Sluice-Priority", "critical")
	itest.EventuallyNoError(t, time.Minute, "the task done", func() error {
		if code, st := getTask(t, g.url, "sk-boss", id); st["status"] != "succeeded" {
			return fmt.Errorf("%d %v", code, st)
		}
		return nil
	})
	ev := g.settlement(t, id+"-1")
	if ev.Tenant != "acme" || ev.APIKeyID != "boss" || ev.Priority != "critical" || ev.CompletionTokens != 7 || ev.Outcome != "ok" {
		t.Fatalf("settlement %+v: want the key's tenant and id, priority critical, the upstream's usage", ev)
	}
	if code, st := getTask(t, g.url, "sk-acme", "task_0000"); code != http.StatusNotFound || st["error"] == nil {
		t.Fatalf("unknown task: %d %v", code, st)
	}
}
