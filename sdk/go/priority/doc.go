// Package priority orders the requests a gateway sends to one upstream
// when that upstream is saturated: critical first, low last.
//
// It has three parts:
//
//   - Effective, the rule that gives a request its class (a
//     schemas.Priority): the tenant's policy class, optionally moved by
//     the X-Sluice-Priority header when the caller's API key may.
//   - Queue, a bounded admission queue in front of an upstream's
//     concurrency limit (a Gate, such as concurrency.Limiter): FIFO within
//     a class, higher classes first with a guaranteed minimum share for
//     the lower ones, a deadline per request that is refused at once when
//     the estimated wait exceeds it, and shedding of the lowest class
//     waiting when the queue is full.
//   - Degrader, the load-driven degradation levels that stop admitting the
//     lower classes before they reach the queue.
//
// Every answer is a Decision that carries its HTTP status (429 or 503),
// its Retry-After and a message a gateway can show the caller. Package
// upstream puts these together with the concurrency limits and the
// upstream breaker behind one call.
package priority
