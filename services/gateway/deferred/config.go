package deferred

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/schemas"
)

// Config is services.gateway.deferred.
type Config struct {
	Enabled     bool   `yaml:"enabled" help:"accept deferred requests (Prefer: respond-async) and serve GET /v1/tasks/{id}; see docs/deferred.md"`
	TopicPrefix string `yaml:"topic_prefix" help:"deferred tasks wait in the topics <topic_prefix>.critical, .high, .normal and .low"`
	// Consumer is the group of the gateways that run deferred tasks.
	kafkaconn.Consumer `yaml:"consumer"`
	// KeyPrefix is where task states, results and the per-class counts
	// live in Redis: not a setting, the gateway derives it from
	// redis.key_prefix; tests may set it.
	KeyPrefix      string        `yaml:"-"`
	Workers        int           `yaml:"workers" help:"deferred tasks this gateway runs at once; 0 accepts tasks but runs none (other gateways of the group do)"`
	Buffer         int           `yaml:"buffer" help:"tasks of one class held in memory waiting for a worker; the class's topic is paused while it is full"`
	MaxPending     int           `yaml:"max_pending" help:"accepted, unfinished tasks per class across the fleet; a submission beyond is refused 429 deferred_queue_full"`
	FullRetryAfter time.Duration `yaml:"full_retry_after" help:"Retry-After of a submission refused because its class is full"`
	MaxTaskBytes   int           `yaml:"max_task_bytes" help:"largest request body a task may carry, in bytes (413 above; must fit the broker's message.max.bytes)"`
	MaxResultBytes int           `yaml:"max_result_bytes" help:"largest answer body stored as a task's result, in bytes (a longer one fails the task with result_too_large)"`
	MaxWait        time.Duration `yaml:"max_wait" help:"how long a task may wait for capacity from its submission; then it fails (expired, or with the last 429/503 it got)"`
	ResultTTL      time.Duration `yaml:"result_ttl" help:"how long a finished task's status and result stay readable"`
	RetryMin       time.Duration `yaml:"retry_min" help:"shortest wait before a task refused for capacity (429/503) runs again"`
	Lease          time.Duration `yaml:"lease" help:"how long a running task is held by its gateway; a task whose gateway died mid-run runs again after it (keep above the upstreams' timeout)"`
	Drain          time.Duration `yaml:"drain" help:"on shutdown, how long running tasks get to finish; those cut go back to their queue"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		TopicPrefix:    "sluice.deferred.v1",
		Consumer:       kafkaconn.Consumer{Group: "sluice-deferred", SessionTimeout: 45 * time.Second},
		Workers:        4,
		Buffer:         64,
		MaxPending:     10_000,
		FullRetryAfter: 30 * time.Second,
		MaxTaskBytes:   512 << 10,
		MaxResultBytes: 1 << 20,
		MaxWait:        24 * time.Hour,
		ResultTTL:      24 * time.Hour,
		RetryMin:       time.Second,
		Lease:          15 * time.Minute,
		Drain:          10 * time.Second,
	}
}

// Validate checks every field (whether or not Enabled, so a mistake shows
// before it is switched on); p prefixes the setting names.
func (c Config) Validate(p string) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(p+format, args...)) }
	if c.TopicPrefix == "" || len(c.TopicPrefix) > 200 {
		bad("topic_prefix: must be 1..200 bytes")
	}
	if err := c.Consumer.Validate(p + "consumer"); err != nil {
		errs = append(errs, err)
	}
	if c.Workers < 0 || c.Workers > 1000 {
		bad("workers: %d is outside 0..1000", c.Workers)
	}
	if c.Buffer < 1 || c.Buffer > 10_000 {
		bad("buffer: %d is outside 1..10000", c.Buffer)
	}
	if c.MaxPending < 1 || c.MaxPending > 10_000_000 {
		bad("max_pending: %d is outside 1..10000000", c.MaxPending)
	}
	if c.FullRetryAfter < time.Second || c.FullRetryAfter > time.Hour {
		bad("full_retry_after: %s is outside 1s..1h", c.FullRetryAfter)
	}
	if c.MaxTaskBytes < 1024 || c.MaxTaskBytes > 900<<10 {
		bad("max_task_bytes: %d is outside 1024..921600 (a task is one Kafka record; the broker's default message.max.bytes is 1 MiB)", c.MaxTaskBytes)
	}
	if c.MaxResultBytes < 1024 || c.MaxResultBytes > 64<<20 {
		bad("max_result_bytes: %d is outside 1024..67108864", c.MaxResultBytes)
	}
	if c.MaxWait < time.Second || c.MaxWait > 30*24*time.Hour {
		bad("max_wait: %s is outside 1s..720h", c.MaxWait)
	}
	if c.ResultTTL < time.Minute || c.ResultTTL > 30*24*time.Hour {
		bad("result_ttl: %s is outside 1m..720h", c.ResultTTL)
	}
	if c.RetryMin < 10*time.Millisecond || c.RetryMin > time.Hour {
		bad("retry_min: %s is outside 10ms..1h", c.RetryMin)
	}
	if c.Lease < time.Second || c.Lease > 24*time.Hour {
		bad("lease: %s is outside 1s..24h", c.Lease)
	}
	if c.Drain <= 0 || c.Drain > time.Hour {
		bad("drain: %s is outside (0, 1h]", c.Drain)
	}
	return errors.Join(errs...)
}

// Classes are the priority classes in the order a Worker serves them:
// schemas.Priorities, highest first.
var Classes = func() (out [schemas.NumPriorities]schemas.Priority) {
	for i, p := range schemas.Priorities {
		out[len(out)-1-i] = p
	}
	return out
}()

// classIndex is p's place in Classes; the empty priority (the tenant's
// default) waits as normal.
func classIndex(p schemas.Priority) int { return schemas.NumPriorities - 1 - p.OrDefault().Index() }

// Topic is the topic of class p's tasks.
func (c Config) Topic(p schemas.Priority) string {
	return c.TopicPrefix + "." + string(Classes[classIndex(p)])
}

// Topics are the four class topics, highest class first.
func (c Config) Topics() []string {
	out := make([]string, len(Classes))
	for i, p := range Classes {
		out[i] = c.Topic(p)
	}
	return out
}
