// Package admission decides, before an LLM call is made, whether the limits
// that apply to it let it through: the synchronous half of Sluice, next to
// the flags the Checker reads for free. Every rule that applies to a request
// is checked in one Redis round trip, all or nothing; the estimate debited
// then is corrected once the call is over; busy rules are served from local
// leases with no round trip at all; and when Redis does not answer within a
// few milliseconds each tenant's fail mode decides.
//
//	l, err := admission.New(client, rules, admission.WithRegisterer(reg))
//	...
//	tk, err := l.Admit(ctx, admission.Request{ID: eventID, Tenant: "acme", Model: "gpt-4o",
//		User: user, Key: keyID, Endpoint: "/v1/chat/completions",
//		PromptTokens: est.Prompt, CompletionTokens: est.Completion})
//	if err != nil { ... } // a request admission cannot judge
//	if !tk.Allowed() {
//		admission.WriteRefusal(w, tk.Decision) // 429 (or 503), Retry-After, OpenAI error body
//		return
//	}
//	admission.WriteHeaders(w.Header(), tk.Decision) // x-ratelimit-* on the 200
//	usage := callUpstream(...)
//	tk.Settle(ctx, admission.Usage{PromptTokens: usage.Prompt, CompletionTokens: usage.Completion})
//
// The policy file's limits section (package policy, server side) produces
// Rules with Policy.AdmissionRules; SetRules swaps them on a reload.
//
// # Rules
//
// A Rule has a scope (any combination of upstream, tenant, model, user, API
// key and endpoint: a dimension is left out, fixed to a value, or Each for a
// counter per distinct value; no dimension at all is global), a unit
// (requests, prompt, completion or total tokens), an algorithm and a limit:
//
//   - TokenBucket: starts full at Limit (the burst) and refills at Rate units
//     per second; a refusal's retry-after is the deficit divided by the rate.
//   - SlidingWindow: at most Limit units in any Window. The window is cut
//     into Granules (60) granules and counts every granule that overlaps
//     the last Window, so it may refuse up to one granule early and never
//     admits more than Limit in any true window of that length. A
//     refusal's retry-after is when enough of the oldest granules leave.
//   - CalendarPeriod: at most Limit units in each period of the rule's
//     Calendar (package policy: an hour, day or month of the tenant's time
//     zone), one counter per instance and period, so a per-user monthly
//     quota costs one hash field per user. The period comes from the
//     gateway's clock (scripts know no time zones; WithClock); a refusal's
//     retry-after is the period's end. It runs exact. With Expires set it
//     is one-off: from Expires on it applies to no request.
//
// Rules.Shared are rules no tenant owns (a platform-wide TPM, a provider
// account's RPM, a per-user limit across tenants); Rules.Tenants[id] and
// Rules.Default are one tenant's own, each tenant with counters of its own.
// Shared rules are checked first, in order, then the tenant's: the rule a
// refusal names is the first that refuses. A request debits 1 from a
// requests rule and its estimate (at least 1) from a tokens rule.
// Rule.Reserve keeps a share of a limit for critical and high priority
// requests (such rules run without leases).
//
// # Layout
//
// One Redis key per rule instance (a rule and the values of its scope),
// with a hash tag of its own, so that instances spread over a Cluster:
//
//	<prefix>{s:<rule>|<dim>=<value>...}:<algorithm>:<unit>    shared rule
//	<prefix>{t:<tenant>:<rule>|<dim>=<value>...}:<algorithm>:<unit>    tenant rule
//
// with prefix DefaultPrefix ("sluice:adm:") unless WithPrefix, dims in the
// order upstream, tenant, model, user, key, endpoint, and the characters
// % | = : { } of names and values percent-encoded (%7C), so no two scopes
// share a key and a value cannot move the hash tag. For example
// sluice:adm:{s:platform-tpm}:sliding_window:total_tokens and
// sluice:adm:{t:acme:per-user|user=bob}:token_bucket:requests.
//
//	token bucket     hash  t = tokens left (may be below 0 after a charge),
//	                       ts = Redis ms of the last update;
//	                       PEXPIRE = time to refill completely + 1 s (an
//	                       absent key is a full bucket)
//	sliding window   hash  <granule index> = units debited in that granule
//	                       (index = Redis ms / granule length);
//	                       PEXPIRE = window + one granule + 1 s
//	calendar period  hash  <period id> = units debited in that period
//	                       (id = its start in Unix ms; older periods'
//	                       fields are deleted when met); PEXPIRE = to
//	                       the period's end + 1 s, never shortened
//	settle marker    string  <instance key>:settled:<settlement id> = "1",
//	                       PEXPIRE WithSettleTTL (10 min); one per slot group
//	                       of a settlement; the id is the admission's own
//	                       (<Limiter nonce>.<sequence>), never Request.ID
//	batch marker     string  <instance key>:adj:<batch id>.<n> = "1",
//	                       PEXPIRE WithSettleTTL; one per call of a batch
//	                       of background corrections (lease rests,
//	                       refunds, local debits), n its place in the batch
//
// All times are Redis's own (TIME in the scripts), so gateways' clocks do
// not matter. (A test may pass the scripts a time of its own instead,
// WithScriptClock, to move past a rolling budget's days.)
//
// # Scripts
//
// The two Lua scripts are files in this package, scripts/admit.lua and
// scripts/adjust.lua, embedded here (AdmitScript, AdjustScript) and meant to
// be loaded by every other SDK from the same files; each file's header
// states its KEYS and ARGV layout and its reply. admit.lua checks every
// instance it is given and only then debits them (plus any lease granted),
// so a refusal by the last rule leaves no debit on the first. adjust.lua
// applies signed corrections without a check, guarded by a marker key for
// idempotency (optional in the script; this package sends every call with
// one). Both run with EVALSHA, falling back to EVAL when Redis does not
// have them cached (redis.Script).
//
// # Redis Cluster
//
// Instances of one request usually live in different slots, and a script
// may only touch keys of one slot. Admit groups the instances by slot and
// sends one admit.lua per group, in one pipeline that go-redis sends to the
// nodes in parallel: one round trip. Each group is atomic on its own; across
// groups the request is all or nothing by compensation: when any group
// refuses, the groups that debited are refunded (adjust.lua) before Admit
// returns. What that gives up, and only on a Cluster and only for a
// refusal: the refusal costs a second round trip; between the two, the
// refunded units look spent to other requests, which may be refused in
// that instant (never over-admitted); and a rule in another slot can debit
// before a rule that refuses (its debit is refunded; on one slot, as on a
// standalone Redis, the refusing rule is seen before any debit). A refund
// Redis does not take is queued and retried like any pending correction,
// and until then errs on the side of refusing. Settlement sends one marker
// per slot group, so it is exactly once in every slot, and a window's
// refund goes to the granule of its own master's clock (each script reads
// its server's TIME; masters' clocks need not agree).
//
// # Estimate then settle
//
// Admit debits the estimate. Ticket.Settle charges or refunds the
// difference with the real usage, once: the ticket records that it ran,
// and corrections sent to Redis carry an id of the admission in a marker,
// so a retried Settle (also from a copy of the ticket, or a replay after a
// timeout) is applied once. That id is made by the Limiter (a random
// nonce of its own and a sequence number), not taken from Request.ID:
// client-chosen ids repeat across tenants, gateways and retries, and a
// marker keyed by one made a request's settlement pass for another's and
// be skipped. A refund of a window goes to the granule the
// estimate was debited in, and is dropped once that granule has left the
// window; a charge goes to the current granule.
//
// # Leases
//
// For a busy rule instance a gateway asks Redis, along with a debit it
// sends anyway, for a lease: about WithLeaseHorizon (100 ms) of the
// instance's observed admission rate, such that the gateway never holds
// more than WithLeaseFraction (1%) of the limit. Redis debits the lease with
// the request (only from what is left: a lease never makes a request
// refused) and the gateway spends it in memory, lock-free: an admission
// whose rules are all covered by leases makes no network call and no
// allocation. When a lease falls below half, a background renewer tops it
// up (one pipelined round trip for every instance waiting), so busy
// admissions do not wait for renewals either. The unused rest goes back to
// Redis when the lease expires (WithLeaseTTL, 1 s, at most a quarter of a
// window), when a window's lease is renewed in a later granule (to the
// granule it was debited in), and on Close. One renewal per instance is in
// flight at a time. Exact rules, rules with a Reserve, and rules whose cap
// is below 4 units take no lease.
//
// A lease holds at least two requests' units (and 4). An instance that
// admits that much within the horizon gets about a horizon's worth; a
// slower one that admits it within the lease's life (WithLeaseTTL) gets a
// lease of just two requests, renewed as it is spent; a slower one still
// takes none and every admission of it goes to Redis, as an Exact rule's
// would. With the defaults (1 s lease life, for windows of 4 s and more),
// measured on one gateway against the real Redis: a requests rule is
// served from leases from 4 requests a second per gateway (18 of 20
// admissions at 5/s; none at 3/s), a total-tokens rule with estimates of
// 500 tokens from 2 to 3 requests a second (6 of 12 at 3/s, 46 of 48 at
// 12/s; none at 1/s). Sized from the 100 ms horizon alone, leases started
// only from about 40 and 20 requests a second.
//
// The bound. A lease is debited before it is spent, so Redis never counts
// less than was admitted at the time it was admitted; what a lease adds is
// a time shift: units counted when the lease was taken are spent up to a
// TTL later, after the window may have moved on (or the bucket refilled).
// So over any window (any bucket interval) the units admitted exceed the
// limit by at most what the gateways held unspent at its start, and a
// gateway never holds more than its cap: with G gateways, overshoot ≤ G ×
// WithLeaseFraction × limit (8% for 8 gateways at the default 1%). What a
// gateway gives back when a call is settled below its estimate goes into
// the same lease only up to the cap, or to Redis, to the granule the
// lease was debited in (never a later one, which would let the window
// forget usage early). In practice overshoot is the lease rests
// outstanding at a window's edge; BenchmarkAdmissionOvershoot measures it
// (admission_overshoot_lease_ratio). Exact rules add no overshoot: Redis
// decides every admission. In both modes an estimate below the real usage
// lets its shortfall through until it is charged at settlement: estimates
// should carry a margin.
//
// The lease path reads a coarse clock (kept by the background loop every
// WithProbeInterval and by every Redis-path admission), so lease expiry,
// idleness and header resets are as precise as that; one admission in 64
// reads the real clock to sample the lease path's latency.
//
// # Failure
//
// Admit and Settle wait at most WithMaxWait (5 ms) for Redis; the client
// must have ContextTimeoutEnabled for the bound to reach the socket, which
// New checks. A call that fails or times out marks Redis unreachable: from
// then on admissions do not call it (so they cost microseconds, not the
// bound) until a probe (WithProbeInterval, 50 ms) gets a PING back within
// the bound. Meanwhile each request follows its tenant's fail mode:
//
//   - FailOpen: a local in-memory limiter per rule instance enforces the same
//     rules with limit and rate divided by WithGatewayCount, starting from
//     Redis's last word on the instance (remaining / gateways). Its debits,
//     and settlements of the tickets it admitted, are kept and sent to
//     Redis as corrections (adjust.lua) once it is back, before the
//     Limiter trusts Redis again: reconciled, not forgotten. Redis is back
//     when it takes those corrections, not when it answers PING: one that
//     answers PING and refuses scripts (a Cluster master down, OOM under
//     noeviction, a READONLY replica, an ACL without EVAL) stays
//     unreachable, and the local limiter keeps its state through every
//     failed attempt; it starts again from Redis only when Redis has
//     answered an admission of the instance since.
//   - FailClosed: refused, Path PathUnavailable, HTTP 503 with the cause.
//
// Leases already held keep being spent. Every correction goes to Redis
// in a call guarded by a marker (a settlement's, or its batch's), and a
// call Redis did not answer is queued and sent again exactly as it was,
// marker included: on a Cluster only the calls of the masters that
// failed. So a call Redis applied but whose reply came after the bound is
// applied once, as long as its retry comes within WithSettleTTL (the
// markers' life). Calls that failed are retried before any newer
// correction is sealed into a call.
//
// Memory is bounded: WithMaxInstances rule instances and as many request
// shapes (beyond them requests are still decided by Redis, without leases,
// and without a persistent local limit while Redis is away); WithMaxPending
// corrections waiting for Redis, merged per instance and granule (beyond
// it a correction is dropped and counted, and Settle reports
// ErrBacklogFull: that settlement's Redis corrections are lost, counted in
// sluice_admission_settlements_total{result="failed"} and logged, unless
// the caller settles the ticket again, which applies them once and its
// in-memory corrections not again). Instances unused for WithIdleTTL are
// forgotten after returning their leases.
//
// # Waiting (Acquire)
//
// Admit refuses at once. Acquire (the gateway's and the middleware's
// call) is Admit for a request that may wait: when the refusing rule's
// Wait gives the request's class a wait (none by default: batch classes
// suit it, interactive ones are better served by a 429 and Retry-After),
// the request waits, at most until the earliest of that wait,
// Request.Deadline and its context's deadline, for the rule to admit it;
// then it is admitted or gets the refusal as Admit would have given it.
// Waiters queue per rule instance, most important class first, then by
// arrival. They never poll: one timer per instance fires at the refusal's
// retry-after, retries the waiters in order (one Admit each) until one is
// refused again, and that refusal's retry-after sets the next wake-up;
// the waiters whose deadline comes before it are refused then, not held
// to it. So waiting costs Redis one call per wake-up and one per
// admission, never one per waiter per tick. A request whose deadline is
// before the first retry-after is refused at once, as is one that finds
// WithMaxWaiters (1,000) requests waiting. Only refusals a wait can end
// wait: not Redis being unreachable, nor a request larger than the limit.
// Each retry is an admission decision in the metrics, like any other.
//
// # Answers
//
// A Decision names the refusing rule exactly (name, scope values, unit,
// algorithm, limit, window or rate, requested, available, retry-after, or
// Never when the request exceeds the limit itself) and carries the
// headroom of the tightest requests rule and tokens rule. Through
// sdk/go/ratelimit (the SDK's one rate-limit format), WriteHeaders sets
// OpenAI's x-ratelimit-limit/remaining/reset-requests and -tokens headers
// (reset as a Go duration, "1s", "6m0s") on admitted answers (Headers
// gives the trios to a caller merging them with other limiters'), and
// WriteRefusal writes a refusal: 429 (503 fail-closed), the same headers,
// Retry-After in seconds and an OpenAI error body (type "tokens" or
// "requests", code "rate_limit_exceeded"; Error builds it) whose "sluice"
// object names the rule.
//
// # Metrics
//
// With WithRegisterer: sluice_admission_requests_total{result},
// sluice_admission_rule_decisions_total{rule,result},
// sluice_admission_duration_seconds{path}, sluice_admission_leases_total
// and sluice_admission_lease_units_total{event=taken|returned},
// sluice_admission_fail_mode_decisions_total{mode,result},
// sluice_admission_redis_roundtrips_total, sluice_admission_redis_errors_total,
// sluice_admission_settlements_total{result},
// sluice_admission_reconciled_units_total,
// sluice_admission_reconcile_dropped_total, sluice_admission_waiters,
// sluice_admission_wait_seconds{class,result} and
// sluice_admission_wait_skipped_total{reason=full|deadline}. deploy/prometheus/rules
// alerts on a denial rate above 5% over 5 minutes.
package admission
