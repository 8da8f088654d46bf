package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
	"github.com/sluicehq/sluice/services/gateway/deferred"
)

// Deferred requests (docs/deferred.md): a POST with Prefer: respond-async
// is checked like any request (key, body, model, priority), then queued
// as a task (package deferred) and answered 202 with its id; a Worker
// runs it later through serveAPI — flags, admission, metering — as a
// request of the same key, and GET /v1/tasks/{id} answers its state.

// headerPrefer carries the deferral request (RFC 7240).
const headerPrefer = "Prefer"

// deferralRequested reports whether r asks for an asynchronous answer:
// a Prefer header with the preference respond-async.
func deferralRequested(r *http.Request) bool {
	for _, v := range r.Header.Values(headerPrefer) {
		for _, pref := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(pref, ";")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// degradedDeferral reports whether c is to be queued as a deferred task
// because its upstreams are degraded (degradation.actions: defer): the
// gateway takes deferred requests, c does not stream nor is a task's run
// (which the worker retries instead), and every upstream of its model is
// guarded and at a level that refuses c's class with the defer action.
// Decided before the call is metered, as a Prefer: respond-async is.
func (s *Server) degradedDeferral(r *http.Request, c *call) bool {
	if s.tasks == nil || c.req.Stream || deferredCaller(r.Context()) != nil || len(c.ups) == 0 {
		return false
	}
	for _, u := range c.ups {
		g := s.guards.Of(u.cfg.Name)
		if g == nil {
			return false
		}
		l := g.Level()
		if l.Admits(c.priority) || u.cfg.DegradedAction(int(l)) != policy.DegradeDefer {
			return false
		}
	}
	return true
}

// deferRequest queues the checked call c as a task and answers 202.
func (s *Server) deferRequest(w http.ResponseWriter, r *http.Request, c *call) {
	switch {
	case s.tasks == nil:
		c.badRequest(w, http.StatusBadRequest, "deferred_not_enabled",
			"This gateway does not accept deferred requests (Prefer: respond-async); its operator can set services.gateway.deferred.enabled.")
		return
	case c.req.Stream:
		c.badParam(w, http.StatusBadRequest, "stream", "deferred_stream",
			"A deferred request cannot stream: leave out \"stream\": true, or send the request without Prefer: respond-async.")
		return
	}
	t := &deferred.Task{Tenant: c.caller.Tenant, KeyID: c.caller.KeyID, Priority: c.priority, Endpoint: c.endpoint, Model: c.req.Model, Body: c.body}
	err := s.tasks.Submit(r.Context(), t)
	switch {
	case errors.Is(err, deferred.ErrTooLarge):
		c.badRequest(w, http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("A deferred request's body may be at most %d bytes (services.gateway.deferred.max_task_bytes); send it without Prefer: respond-async.", s.tasks.Config().MaxTaskBytes))
		return
	case errors.Is(err, deferred.ErrFull):
		ra := s.tasks.Config().FullRetryAfter
		c.refuse(w, http.StatusTooManyRequests, ratelimit.Error{Type: "requests", Code: "deferred_queue_full",
			Message: fmt.Sprintf("The queue of deferred %s-priority requests is full (services.gateway.deferred.max_pending tasks waiting). Retry after %v.", className(c.priority), ra)}, ra)
		return
	case err != nil:
		s.log.Error("a deferred request could not be queued", "tenant", c.caller.Tenant, "err", err)
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "deferred_unavailable",
			"The gateway could not queue the deferred request now; retry, or send it without Prefer: respond-async.")
		c.end(schemas.OutcomeError, "deferred_unavailable")
		return
	}
	c.end(schemas.OutcomeOK, codeDeferred)
	w.Header().Set("Preference-Applied", "respond-async")
	w.Header().Set("Location", "/v1/tasks/"+t.ID)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(deferred.State{ID: t.ID, Status: deferred.Queued, Priority: t.Priority,
		Endpoint: t.Endpoint, Model: t.Model, Created: t.Created})
}

// className names p's queue: the tenant's default waits as normal.
func className(p schemas.Priority) string {
	if p == "" {
		return string(schemas.PriorityNormal)
	}
	return string(p)
}

// getTask answers GET /v1/tasks/{id} for the key's tenant.
func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	caller := s.authenticate(w, r)
	if caller == nil {
		return
	}
	if s.tasks == nil {
		writeError(w, http.StatusNotFound, "invalid_request_error", "deferred_not_enabled",
			"This gateway does not accept deferred requests; its operator can set services.gateway.deferred.enabled.")
		return
	}
	id := r.PathValue("id")
	st, ok, err := s.tasks.Get(r.Context(), caller.Tenant, id)
	switch {
	case err != nil:
		s.log.Error("a deferred task's state could not be read", "task", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "deferred_unavailable", "The task's state cannot be read now; retry.")
		return
	case !ok:
		writeError(w, http.StatusNotFound, "invalid_request_error", "task_not_found",
			fmt.Sprintf("No task %q for this key's tenant: the id is wrong, or the task finished more than services.gateway.deferred.result_ttl ago.", id))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// deferredCallerKey carries, in a task run's context, the caller the run
// is authenticated as (a client cannot set a context value).
type deferredCallerKey struct{}

// deferredCaller is the caller of a task run, or nil for a client's
// request.
func deferredCaller(ctx context.Context) *frontend.Caller {
	c, _ := ctx.Value(deferredCallerKey{}).(*frontend.Caller)
	return c
}

// RunTask is the deferred.Executor: it runs task t (run number run) as a
// request of its key — if the keys file still has it — with the task's
// priority and the request id <task id>-<run>, through the same path as
// a client's request, and returns the answer, bounded by limit bytes.
func (s *Server) RunTask(ctx context.Context, t *deferred.Task, run int, limit int) deferred.Outcome {
	found := s.keyByID(t.Tenant, t.KeyID)
	if found == nil {
		return deferred.Outcome{ErrorCode: "key_revoked",
			Error: fmt.Sprintf("the API key %s of tenant %s is no longer in the gateway's keys file nor valid in the admin API; the task did not run", t.KeyID, t.Tenant)}
	}
	cp := *found
	caller := &cp
	caller.Priority, caller.MaySetPriority = t.Priority, false
	req, err := http.NewRequestWithContext(context.WithValue(ctx, deferredCallerKey{}, caller), http.MethodPost, t.Endpoint, bytes.NewReader(t.Body))
	if err != nil {
		return deferred.Outcome{ErrorCode: "bad_task", Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(headerRequestID, fmt.Sprintf("%s-%d", t.ID, run))
	rec := deferred.NewRecorder(limit)
	s.serveAPI(rec, req)
	return rec.Outcome()
}

// startDeferred builds, for cfg.Deferred.Enabled, the Queue New serves
// and a function that runs the Worker on s until ctx ends (nil with
// workers 0). stop closes what it built.
func startDeferred(ctx context.Context, cfg Config, env platform.Env, rdb redis.UniversalClient, log *slog.Logger) (
	q *deferred.Queue, worker func(ctx context.Context, s *Server) error, stop func(), err error) {
	stop = func() {}
	if !cfg.Deferred.Enabled {
		return nil, nil, stop, nil
	}
	dc := cfg.Deferred
	if dc.KeyPrefix == "" {
		dc.KeyPrefix = env.Redis.Prefix(redisconn.DeferredKeys)
	}
	m := deferred.NewMetrics()
	if err := m.Register(env.Metrics); err != nil {
		return nil, nil, stop, fmt.Errorf("gateway: register deferred metrics: %w", err)
	}
	q, err = deferred.NewQueue(ctx, dc, env.Kafka, rdb, m)
	if err != nil {
		m.Unregister(env.Metrics)
		return nil, nil, stop, err
	}
	stop = func() { q.Close(); m.Unregister(env.Metrics) }
	if dc.Workers == 0 {
		log.Info("deferred requests accepted; this gateway runs none (services.gateway.deferred.workers is 0)", "topics", dc.Topics())
		return q, nil, stop, nil
	}
	worker = func(ctx context.Context, s *Server) error {
		exec := func(ctx context.Context, t *deferred.Task, run int) deferred.Outcome {
			return s.RunTask(ctx, t, run, dc.MaxResultBytes)
		}
		w, err := deferred.NewWorker(dc, env.Kafka, rdb, exec, log.With("component", "deferred"), m)
		if err != nil {
			return err
		}
		env.Health.AddReadiness("gateway-deferred", w.Ready)
		defer env.Health.RemoveReadiness("gateway-deferred")
		log.Info("running deferred requests", "topics", dc.Topics(), "group", dc.Group, "workers", dc.Workers)
		return w.Run(ctx)
	}
	return q, worker, stop, nil
}
