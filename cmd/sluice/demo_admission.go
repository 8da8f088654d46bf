package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

const demoAdmissionWait = 50 * time.Millisecond

// demoAdmission builds the demo gateway's admission Limiter from the
// demo policy's limits and per-minute quotas, and the task that swaps its
// rules when the policy file changes (as the services follow it). The
// Limiter has a Redis client of its own because admission needs context
// timeouts on it (its wait bound must reach the socket), and counts under
// the run's key prefix, so an earlier demo's counters refuse nothing in
// this one. release closes both once the gateway has stopped.
func demoAdmission(cfg *Config, reg prometheus.Registerer, log *slog.Logger) (lim *admission.Limiter, follow lifecycle.Task, release func(), err error) {
	w, err := policy.NewWatcher(cfg.PolicyFile, cfg.Services.Enforcer.PolicyReload, log)
	if err != nil {
		return nil, lifecycle.Task{}, nil, err
	}
	rdb := redisconn.NewClient(cfg.Redis, redisconn.ContextTimeouts())
	// Admission waits at most a few milliseconds for Redis and treats a
	// miss as Redis being away (trial, fail-closed, would get 503s):
	// connect and load the scripts now, not within the first request.
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range []string{admission.AdmitScript, admission.AdjustScript} {
		if err := rdb.ScriptLoad(wctx, s).Err(); err != nil {
			rdb.Close()
			return nil, lifecycle.Task{}, nil, fmt.Errorf("admission: loading its scripts into Redis: %w", err)
		}
	}
	lim, err = admission.New(rdb, w.Current().AdmissionRules(),
		admission.WithPrefix(cfg.Services.Enforcer.KeyPrefix+"adm:"), admission.WithRegisterer(reg), admission.WithLogger(log),
		// The demo shares one machine with the whole pipeline (Kafka,
		// ClickHouse, the services): a Redis answer late by a scheduling
		// hiccup must not read as Redis being away. A gateway of its own
		// keeps the 5 ms default.
		admission.WithMaxWait(demoAdmissionWait))
	if err != nil {
		rdb.Close()
		return nil, lifecycle.Task{}, nil, err
	}
	follow = lifecycle.Task{Name: "admission-policy", Run: func(ctx context.Context) error {
		return w.Follow(ctx, frontend.ReloadRules(lim, (*policy.Policy).AdmissionRules, "admission", log))
	}}
	return lim, follow, func() { _ = lim.Close(); _ = rdb.Close() }, nil
}

// admissionCounts counts per tenant what admission decided in the demo's
// `sluice gateway`, for the live view: it is the gateway's Admitter,
// passing every request to the Limiter's and counting its answers (flag
// refusals never reach admission and are not counted).
type admissionCounts struct {
	next frontend.Admitter

	mu sync.Mutex
	m  map[string]*tenantAdmissions
}

type tenantAdmissions struct {
	admitted, refused int64
	rule              string // of the latest refusal
}

func newAdmissionCounts(next frontend.Admitter) *admissionCounts {
	return &admissionCounts{next: next, m: map[string]*tenantAdmissions{}}
}

// Admit implements frontend.Admitter.
func (c *admissionCounts) Admit(ctx context.Context, req frontend.AdmitRequest) frontend.Admission {
	a := c.next.Admit(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	ta := c.m[req.Tenant]
	if ta == nil {
		ta = &tenantAdmissions{}
		c.m[req.Tenant] = ta
	}
	if a.Refused == nil {
		ta.admitted++
		return a
	}
	ta.refused++
	if d, ok := a.Refused.Error.Sluice.(*admission.Detail); ok {
		ta.rule = d.Rule
	}
	return a
}

// of returns a tenant's counts.
func (c *admissionCounts) of(tenant string) (admitted, refused int64, rule string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ta := c.m[tenant]; ta != nil {
		return ta.admitted, ta.refused, ta.rule
	}
	return 0, 0, ""
}
