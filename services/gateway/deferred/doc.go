// Package deferred is `sluice gateway`'s queue of deferred requests (seed
// 000's queue), for callers that do not need an answer now: a request
// sent with `Prefer: respond-async` is answered 202 with a task id at
// once, waits in Kafka by priority, and runs through the gateway's normal
// request path (flags, admission, metering) when capacity allows; GET
// /v1/tasks/{id} answers its status and, once it finished, its result.
// docs/deferred.md is the user's page; this is the design.
//
// # Where a task waits
//
// One Kafka topic per priority class, <topic_prefix>.critical, .high,
// .normal and .low, keyed by task id. A Queue (the accepting side)
// produces a task and answers 202 only once Kafka acknowledged it, so an
// accepted task survives any gateway's crash or restart. A Worker (the
// running side; every gateway of the fleet may run one) reads the four
// topics in one consumer group, holds at most Buffer tasks per class in
// memory (pausing a class's topic while its buffer is full) and always
// starts the highest class it holds first, FIFO within a class (by
// submission time, across the class's partitions) — strictly:
// a critical task never waits behind a lower one, and lower classes run
// when higher ones leave capacity.
//
// # Bounds and the policy when full
//
// Each class holds at most MaxPending tasks that were accepted and not
// yet finished, counted fleet-wide in Redis (a sorted set per class, its
// entries older than MaxWait pruned so a crashed gateway's count cannot
// leak). A submission to a full class is refused at once, 429 with code
// deferred_queue_full and Retry-After (FullRetryAfter); a task once
// accepted is never dropped for room. Each task's body is at most
// MaxTaskBytes (413 above; a Kafka record must fit the broker's
// message.max.bytes), each stored result at most MaxResultBytes (a longer
// answer is kept as its status with error result_too_large).
//
// # Running and retrying
//
// A Worker claims a task in Redis before it runs it: a lease (Lease) for
// one run, named by a random run token, so that a task does not run twice
// at once — whether its partition moved to another gateway during a
// rebalance, or moved away and back to the same one, whose record of it
// is then read again: the claim refuses a running task to anyone without
// its run's token (the same gateway too), only that token puts it back,
// and a Worker never starts a task id it runs already. A task whose
// gateway died mid-run is taken over when the lease ends. A Worker keeps
// only records of the partitions the group assigns it now: a rebalance
// waits until what a poll fetched is buffered (kgo.BlockRebalanceOnPoll),
// so a revocation drops every record of its partitions, and none arrives
// after it to recreate their state and commit offsets another gateway
// owns. The Executor runs the
// task as a request of the tenant's key (still in the keys file, else the
// task fails) with its priority; an answer 429 or 503 (a limit, a
// breaker, a saturated upstream) is not the result but "no capacity now":
// the task goes back to its class and runs again after the answer's
// Retry-After (at least RetryMin), until MaxWait from its submission is
// over — then it fails: with the last answer as its result when its next
// try would come too late, as expired when it is found too late. Each run has
// its own request (and usage event) id, <task id>-<run>, so a task run
// twice (a crash mid-run) is metered twice, as the upstream billed it.
//
// # Results
//
// In Redis, one hash per task under KeyPrefix: status (queued, running,
// succeeded, failed), who, when, the run count and, once finished, the
// answer's status, content type and body. It lives MaxWait+ResultTTL
// from its submission and ResultTTL from its end; after that GET answers
// 404. Kafka offsets are committed per partition up to the first task not
// yet finished, so a restart re-reads only unfinished tasks (and skips
// those Redis says are finished).
package deferred
