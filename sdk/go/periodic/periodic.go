// Package periodic runs a function at a fixed interval until a context
// ends: the loop behind the SDK's background Run methods (a breaker
// following its fleet, a shared count renewing its lease), for any other
// caller that needs the same.
package periodic

import (
	"context"
	"time"
)

// Every calls f every interval, the first time one interval from now,
// until ctx ends; then it returns. A call of f that outlasts the interval
// delays the next one rather than overlapping it (the ticker drops the
// ticks it missed). interval must be positive, as for time.NewTicker.
func Every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
