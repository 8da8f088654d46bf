package ingest

import (
	"strings"
	"testing"
	"time"
)

// small_request_max_events out of range is refused at start, naming the
// setting and its range.
func TestSmallRequestMaxEventsIsValidated(t *testing.T) {
	for _, n := range []int{-1, 1001} {
		c := DefaultConfig()
		c.AllowAnonymous = true
		c.SmallRequestMaxEvents = n
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "small_request_max_events: ") || !strings.Contains(err.Error(), "0..1000") {
			t.Errorf("%d: %v, want an error naming small_request_max_events and 0..1000", n, err)
		}
	}
	c := DefaultConfig()
	c.AllowAnonymous = true
	c.SmallRequestMaxEvents = 0
	if err := c.Validate(); err != nil {
		t.Errorf("0 (one producer for every request): %v", err)
	}
}

// The small-request producer's linger and codec are checked at start: a
// linger above the large requests' own, or an unknown codec, is refused
// naming the setting.
func TestSmallRequestProducerIsValidated(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"negative linger", func(c *Config) { c.SmallRequestLinger = -time.Millisecond }, "small_request_linger: -1ms is outside 0..linger (5ms)"},
		{"linger above linger", func(c *Config) { c.SmallRequestLinger = 6 * time.Millisecond }, "small_request_linger: 6ms is outside 0..linger (5ms)"},
		{"unknown codec", func(c *Config) { c.SmallRequestCompression = "brotli" }, `small_request_compression: "brotli" is not one of lz4, zstd, snappy, gzip, none`},
		{"unknown codec for all", func(c *Config) { c.Compression = "lz5" }, `compression: "lz5" is not one of`},
	} {
		c := DefaultConfig()
		c.AllowAnonymous = true
		tc.set(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	for _, ok := range []func(*Config){
		func(c *Config) { c.SmallRequestLinger = 0 },
		func(c *Config) { c.SmallRequestLinger = c.Linger },
		func(c *Config) { c.SmallRequestCompression = "none" },
	} {
		c := DefaultConfig()
		c.AllowAnonymous = true
		ok(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
