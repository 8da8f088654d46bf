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
	// RedisTimeout bounds each Redis call of a shared upstream's counts;
	// past it this process counts alone until Redis answers.
	RedisTimeout time.Duration `yaml:"redis_timeout" help:"longest one Redis call of a shared upstream's counts (calls in flight, reserved shares, the fleet-wide breaker) may take; past it the gateway counts that upstream's calls in this process alone until Redis answers again"`
}

func defaultSharedUpstreams() SharedUpstreamsConfig {
	return SharedUpstreamsConfig{RedisTimeout: 100 * time.Millisecond}
}

// Validate checks c as the section at p (services.gateway.shared_upstreams.),
// naming each field with it.
func (c SharedUpstreamsConfig) Validate(p string) error {
	var errs []error
	if c.RedisTimeout < time.Millisecond || c.RedisTimeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("%sredis_timeout: %s is outside 1ms..10s", p, c.RedisTimeout))
	}
	return errors.Join(errs...)
}
