package gateway

import (
	"errors"
	"fmt"
	"time"
)

// SharedUpstreamsConfig is where the upstreams the policy marks shared
// keep their fleet-wide state: calls in flight, the breaker, reserved
// shares. Only sluice gateway calls upstreams, so only it has this
// section (services.gateway.shared_upstreams).
type SharedUpstreamsConfig struct {
	KeyPrefix string `yaml:"key_prefix" help:"prefix of the Redis keys of the policy's shared upstreams (calls in flight, breaker, reserved shares); gateways sharing this Redis and prefix share them"`
	// RedisTimeout bounds each Redis call of a shared upstream's counts;
	// past it this process counts alone until Redis answers.
	RedisTimeout time.Duration `yaml:"redis_timeout" help:"longest one Redis call of a shared upstream's counts (calls in flight, reserved shares) may take; past it the gateway counts that upstream's calls in this process alone until Redis answers again"`
}

// DefaultUpstreamKeyPrefix is services.gateway.shared_upstreams.key_prefix's default.
const DefaultUpstreamKeyPrefix = "sluice:up:"

func defaultSharedUpstreams() SharedUpstreamsConfig {
	return SharedUpstreamsConfig{KeyPrefix: DefaultUpstreamKeyPrefix, RedisTimeout: 100 * time.Millisecond}
}

// Validate checks c as the section at p (services.gateway.shared_upstreams.),
// naming each field with it.
func (c SharedUpstreamsConfig) Validate(p string) error {
	var errs []error
	if c.KeyPrefix == "" || len(c.KeyPrefix) > 200 {
		errs = append(errs, fmt.Errorf("%skey_prefix: must be 1..200 bytes", p))
	}
	if c.RedisTimeout < time.Millisecond || c.RedisTimeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("%sredis_timeout: %s is outside 1ms..10s", p, c.RedisTimeout))
	}
	return errors.Join(errs...)
}
