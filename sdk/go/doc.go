// Package sdk is the Go SDK that LLM gateways import to use Sluice:
//
//   - emitter sends usage events to ingest (or straight to Kafka), batched,
//     bounded and retried; emitter/emittertest records them instead, for
//     the tests of code that emits events;
//   - checker keeps every enforcement flag in memory and answers a request
//     check with a map lookup and no network call;
//   - middleware wraps a net/http handler with that check and answers 429 or
//     503 naming the limit, and, given an Emitter, emits a rejected usage
//     event for each refusal so that refusals are counted; with an
//     Estimator it emits an estimate of each call before it runs and the
//     settlement with the real usage after, and with an admission Limiter
//     it checks the limits for the caller its Identify function names
//     (tenant, model, key, user and priority class);
//   - estimate counts a request's prompt tokens from its OpenAI body and
//     adds the expected completion (the request's bound or a learned
//     per-tenant × model ratio);
//   - ratelimit writes OpenAI's rate-limit headers, Retry-After and 429
//     bodies, for the middleware and any other limiter;
//   - flags is the Redis layout the enforcer writes and the checker reads
//     (docs/flags.md describes it for gateways in other languages);
//   - admission checks the limits that apply to a request before the call,
//     in one Redis round trip or from local leases, settles the estimate
//     afterwards, and writes OpenAI's rate-limit headers and 429s;
//   - upstream guards an upstream every tenant shares: its breaker,
//     load-driven degradation, per-tenant concurrency and the priority
//     queue, behind one Acquire; priority holds the classes, the queue
//     and the degradation levels, concurrency the in-flight limits and
//     their adaptive algorithms (a threshold step rule and a gradient), shared
//     across processes through Redis where the upstream is;
//   - resource samples the process's CPU and memory use (against the
//     container's cgroup v2 limits) in the background, for degradation
//     levels that follow them too (upstream.LoadFunc);
//   - periodic runs a function at an interval until a context ends (the
//     loop of upstream.Breaker.Run and concurrency.Shared.Run).
//
// The SDK lives in the root module (github.com/sluicehq/sluice) but links
// nothing server-only: no ClickHouse driver, no embedded Kafka broker, no
// YAML loader, no service package. TestSDKLinksNothingServerOnly enforces
// that, and TestOutsideModuleBuildsAGateway builds a gateway in a module of
// its own, as a user would.
package sdk
