package ingest

import (
	"strings"
	"testing"
)

// linger_free_max_events out of range is refused at start, naming the
// setting and its range.
func TestLingerFreeMaxEventsIsValidated(t *testing.T) {
	for _, n := range []int{-1, 1001} {
		c := DefaultConfig()
		c.AllowAnonymous = true
		c.LingerFreeMaxEvents = n
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "services.ingest.linger_free_max_events: ") || !strings.Contains(err.Error(), "0..1000") {
			t.Errorf("%d: %v, want an error naming linger_free_max_events and 0..1000", n, err)
		}
	}
	c := DefaultConfig()
	c.AllowAnonymous = true
	c.LingerFreeMaxEvents = 0
	if err := c.Validate(); err != nil {
		t.Errorf("0 (every request lingers): %v", err)
	}
}
