// Package emittertest records usage events in place of a gateway's Emitter
// (sdk/go/emitter), for the tests of the code that emits them: the
// gateway middleware, sluice gateway, the forward-auth endpoint and the
// reference gateway.
package emittertest

import (
	"sync"

	"github.com/sluicehq/sluice/schemas"
)

// Recorder keeps every event it is given, in order. It is safe for
// concurrent use (handlers emit from the server's goroutines), and its
// zero value is ready to use.
//
// Emit panics on an event that does not validate: the real Emitter would
// drop it, so it is a bug of the code under test, shown where it happens
// rather than as an event missing later.
type Recorder struct {
	mu     sync.Mutex
	events []schemas.UsageEvent
}

// Emit records a copy of ev.
func (r *Recorder) Emit(ev *schemas.UsageEvent) error {
	if err := ev.Validate(); err != nil {
		panic("emittertest: invalid event emitted: " + err.Error())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, *ev)
	return nil
}

// Events returns the events recorded so far.
func (r *Recorder) Events() []schemas.UsageEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]schemas.UsageEvent(nil), r.events...)
}

// Take returns the events recorded so far and forgets them, so that the
// next Events or Take sees only what was emitted after.
func (r *Recorder) Take() []schemas.UsageEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}
