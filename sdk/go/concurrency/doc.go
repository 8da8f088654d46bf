// Package concurrency bounds the calls a gateway has in flight to one
// upstream, and learns that bound from how the upstream answers.
//
// A Limiter counts calls in flight against a limit that an Algorithm sets:
//
//   - Fixed: a constant limit.
//   - Threshold: a step rule on latency and error thresholds. Over a sliding
//     window (60 s) it is re-evaluated at a fixed interval (10 s): an
//     average latency above 2 s or more than 10% errors multiplies the
//     limit by 0.8, not below a minimum; an average latency below 500 ms
//     with less than 1% errors multiplies it by 1.2, not above a maximum.
//   - Gradient: the limit follows the ratio of the best recent latency to
//     the current one, the idea of Netflix's concurrency-limits: while
//     the upstream answers as fast as it can, the limit grows by a
//     headroom; when queueing inside the upstream makes answers slower,
//     the limit shrinks in proportion.
//
// Keyed counts calls in flight per key (a tenant on an upstream) against
// a limit given at each call, for the per-tenant × upstream bound.
//
// Shared counts an upstream's calls in flight across gateway processes in
// Redis, for an upstream the fleet shares: one script call per acquire,
// per-process counts under leases that expire when a process dies, and a
// fall-back to counting alone when Redis is unreachable.
//
// Algorithms take the time as an argument, so tests and simulations drive
// them with their own clock. Every type is safe for concurrent use.
package concurrency
