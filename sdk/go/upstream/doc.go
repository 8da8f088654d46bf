// Package upstream guards one upstream — a provider account, a
// self-hosted model — that every tenant of a gateway shares, so that
// when it saturates or fails the gateway sheds the least important work
// first instead of passing the upstream's own 429s and timeouts to
// everyone alike.
//
// A Guard puts, in this order, in front of each call:
//
//  1. the upstream's Breaker (consecutive failures, error ratio, slow
//     calls; open, then probes with a growing back-off);
//  2. the degradation level (priority.Degrader) computed from the load:
//     the requests in the gateway for this upstream against its limit and
//     queue, and the breaker;
//  3. the tenant's own concurrency limit on this upstream
//     (concurrency.Keyed), a fixed number or a share of the upstream's
//     limit;
//  4. reserved shares (Reserve, optional): past a saturation threshold
//     of the upstream's capacity each class is held to its share, across
//     the fleet through Redis;
//  5. the priority queue (priority.Queue) in front of the upstream's
//     concurrency limit (concurrency.Limiter with a Fixed, Threshold or
//     Gradient algorithm).
//
// One call, Acquire, runs them all and answers with a priority.Decision
// (admitted, or refused with 429 or 503 and a Retry-After) and, when
// admitted, a Permit whose Release reports the call's outcome to the
// limit's algorithm, the queue's service-rate estimate and the breaker.
//
// For an upstream the whole fleet shares, concurrency.Shared counts its
// calls in flight across gateway processes in Redis (SharedGate), and
// Fleet shares its breaker — open together, probes counted fleet-wide,
// a growing back-off when they fail (BreakerOptions(FleetWide(…))), and
// each probe due back by a deadline (ProbeTimeout plus ProbeMargin) after
// which it is handed out again, so a gateway that dies holding probes
// cannot hold the fleet half-open. Guard.Run does their background work.
package upstream
