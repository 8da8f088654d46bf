package priority

import (
	"fmt"
	"strconv"
	"time"
)

// TimeoutHeader is the request header through which a caller gives its
// own deadline: how many milliseconds, from the gateway's receipt of the
// request, it is willing to wait for the upstream call to start. The
// Queue refuses at once (Deadline) a request whose estimated wait exceeds
// it, and refuses it when it is reached (Expired) — never later, and
// never after the Queue's own MaxWait, which bounds a longer timeout.
// The call itself, once started, is not cut by it.
const TimeoutHeader = "X-Sluice-Timeout-Ms"

// MaxTimeout bounds TimeoutHeader's value.
const MaxTimeout = time.Hour

// DeadlineOf returns the deadline TimeoutHeader's value v gives a request
// received at now: zero for an empty v (the Queue's MaxWait applies), an
// error naming the header and the bounds for anything but a whole number
// of milliseconds in 1..MaxTimeout.
func DeadlineOf(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 1 || ms > MaxTimeout.Milliseconds() {
		return time.Time{}, fmt.Errorf("header %s: %q is not a whole number of milliseconds in 1..%d", TimeoutHeader, v, MaxTimeout.Milliseconds())
	}
	return now.Add(time.Duration(ms) * time.Millisecond), nil
}
