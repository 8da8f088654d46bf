package priority

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Reason says why a request was admitted or refused.
type Reason uint8

// The reasons. The Queue sets Admitted, QueueFull, Shed, Deadline,
// Expired and Canceled; the layers in front of it (package upstream)
// set TenantLimit, Degraded and BreakerOpen.
const (
	// Admitted: the request holds a slot of the upstream.
	Admitted Reason = iota
	// QueueFull: the queue was full of requests of the same class or
	// above, so this one was refused on arrival.
	QueueFull
	// Shed: the request was waiting and was evicted to make room for a
	// request of a higher class.
	Shed
	// Deadline: the estimated wait exceeded the request's deadline, so it
	// was refused on arrival rather than at its deadline.
	Deadline
	// Expired: the request waited until its deadline; the estimate had
	// been too short (the upstream slowed down, or higher classes arrived).
	Expired
	// Canceled: the caller's context ended while the request waited.
	Canceled
	// TenantLimit: the tenant already has as many requests on this
	// upstream as it may.
	TenantLimit
	// Degraded: the upstream's degradation level does not admit the
	// request's class.
	Degraded
	// BreakerOpen: the upstream's breaker is open (or half-open with every
	// probe taken).
	BreakerOpen
	// ClassShare: the upstream is past its saturation threshold and the
	// request's class has used its reserved share (upstream.Reserve).
	ClassShare
)

var reasonNames = [...]string{"admitted", "queue_full", "shed", "deadline", "expired", "canceled", "tenant_concurrency", "degraded", "breaker_open", "class_share"}

// String is the reason as a lower_snake_case code, usable as an error
// code in a response body and as a metric label.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// StatusClientClosedRequest is the status logged for a request whose
// caller went away (nginx's convention); nobody reads the answer.
const StatusClientClosedRequest = 499

// Decision is the answer to an admission request.
type Decision struct {
	Reason Reason
	// Class is the class the request was decided under.
	Priority schemas.Priority
	// Waited is how long the request spent in the queue.
	Waited time.Duration
	// Estimate is the wait the queue estimated for the request on
	// arrival; zero when it was admitted at once or nothing was known.
	Estimate time.Duration
	// RetryAfter is how long a refused caller should wait before trying
	// again; zero when admitted.
	RetryAfter time.Duration
	// Level is the degradation level that refused (Degraded only).
	Level Level
}

// Admitted reports whether the request may call the upstream.
func (d Decision) Admitted() bool { return d.Reason == Admitted }

// Status is the HTTP status that answers a refusal: 429 when the
// tenant's own share is used up (TenantLimit), 503 when the upstream is
// saturated, degraded or broken (the caller is not at fault and another
// upstream or a later retry may serve it), 499 when the caller went
// away, and 200 when admitted.
func (d Decision) Status() int {
	switch d.Reason {
	case Admitted:
		return http.StatusOK
	case TenantLimit:
		return http.StatusTooManyRequests
	case Canceled:
		return StatusClientClosedRequest
	}
	return http.StatusServiceUnavailable
}

// Message is a sentence for the caller saying why it was refused. It
// names no other tenant and no internal setting beyond the numbers a
// caller can act on.
func (d Decision) Message() string {
	retry := ""
	if d.RetryAfter > 0 {
		retry = fmt.Sprintf("; retry after %v", d.RetryAfter.Round(time.Second))
	}
	switch d.Reason {
	case Admitted:
		return "admitted"
	case QueueFull:
		return fmt.Sprintf("upstream saturated: the queue is full of requests of priority %s or above%s", d.Priority, retry)
	case Shed:
		return fmt.Sprintf("upstream saturated: this priority %s request was shed for a higher-priority one after waiting %v%s", d.Priority, d.Waited.Round(time.Millisecond), retry)
	case Deadline:
		return fmt.Sprintf("upstream saturated: the estimated wait of %v for priority %s exceeds the request's deadline%s", d.Estimate.Round(time.Millisecond), d.Priority, retry)
	case Expired:
		return fmt.Sprintf("upstream saturated: priority %s request reached its deadline after waiting %v%s", d.Priority, d.Waited.Round(time.Millisecond), retry)
	case Canceled:
		return "the request was canceled while waiting for the upstream"
	case TenantLimit:
		return fmt.Sprintf("too many concurrent requests from this tenant to this upstream%s", retry)
	case Degraded:
		return fmt.Sprintf("service degraded (level %d: %s): priority %s requests are not admitted%s", d.Level, d.Level.admits(), d.Priority, retry)
	case BreakerOpen:
		return fmt.Sprintf("upstream unavailable: its circuit breaker is open%s", retry)
	case ClassShare:
		return fmt.Sprintf("upstream saturated: priority %s requests have used their reserved share of it%s", d.Priority, retry)
	}
	return d.Reason.String()
}
