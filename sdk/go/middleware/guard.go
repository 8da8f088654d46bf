package middleware

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// GuardFunc picks the upstream.Guard a request goes through and what the
// Guard needs to know of it (tenant, priority class, deadline): a gateway
// keeps one Guard per upstream and chooses by model or route. An empty
// Tenant or Priority in the upstream.Request is the Identity's. ok false
// (or a nil Guard) lets the request through unguarded.
type GuardFunc func(r *http.Request, tenant, model string) (g *upstream.Guard, req upstream.Request, ok bool)

// WithGuard puts each metered request (WithEstimates is required)
// through its upstream's Guard after the flags and admission, before the
// estimate event: the upstream's breaker, its degradation level, the
// tenant's concurrency on it and the priority queue, which may hold the
// request until a slot is free. A refusal is answered by
// priority.WriteRefusal (503, or 429 for the tenant's own concurrency,
// with Retry-After and a body naming the reason), emitted as a refusal
// event (attribute refused_by=upstream, reason the Decision's), and
// refunds admission's debit. An admitted request holds its slot until the
// handler returns; the slot is released with the call's outcome: a
// failure when the answer was a 5xx or a 429 or the handler panicked,
// nothing learned when the client went away, a success otherwise.
func WithGuard(f GuardFunc) Option { return func(m *mw) { m.guard = f } }

// guarded runs the request through its Guard. refused true means the
// refusal was answered and the handler must not run.
func (m *mw) guarded(w http.ResponseWriter, r *http.Request, base *schemas.UsageEvent, tenant, model string, ticket *admission.Ticket) (p upstream.Permit, refused bool) {
	if m.guard == nil {
		return p, false
	}
	g, req, ok := m.guard(r, tenant, model)
	if !ok || g == nil {
		return p, false
	}
	if req.Tenant == "" {
		req.Tenant = tenant
	}
	if req.Priority == "" {
		req.Priority = base.Priority // the Identity's class, else WithEventFields'
	}
	p, d := g.Acquire(r.Context(), req)
	if d.Admitted() {
		return p, false
	}
	if ticket != nil {
		// Nothing ran: admission's debit goes back.
		_ = ticket.Settle(context.WithoutCancel(r.Context()), admission.Usage{})
	}
	if d.Reason == priority.Canceled {
		return p, true // nobody reads the answer
	}
	if m.log != nil {
		m.log.LogAttrs(r.Context(), slog.LevelInfo, "sluice refused a request before the upstream",
			slog.String("tenant", tenant), slog.String("model", model), slog.String("upstream", g.Name()),
			slog.String("reason", d.Reason.String()), slog.String("priority", string(d.Priority)))
	}
	if m.emitRefusals {
		ev := *base
		ev.ID = "rej-" + ev.ID
		ev.Time, ev.Status, ev.Outcome = m.now().UTC(), d.Status(), schemas.OutcomeRejected
		ev.Priority = d.Priority
		ev.Attributes = map[string]string{"refused_by": "upstream", "reason": d.Reason.String()}
		_ = m.emitter.Emit(&ev)
	}
	priority.WriteRefusal(w, d)
	return p, true
}

// guardOutcome classifies a settled call for the Guard's limit and
// breaker.
func guardOutcome(ev schemas.UsageEvent) concurrency.Outcome {
	switch {
	case ev.Attributes["cancelled"] != "":
		return concurrency.Ignored
	case ev.Outcome == schemas.OutcomeError, ev.Outcome == schemas.OutcomeTimeout,
		ev.Status >= 500, ev.Status == http.StatusTooManyRequests:
		return concurrency.Failure
	}
	return concurrency.Success
}
