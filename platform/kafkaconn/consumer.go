package kafkaconn

import (
	"errors"
	"fmt"
	"time"
)

// Consumer is a consuming service's group settings: its consumer section
// (services.<name>.consumer), declared once so that every service spells
// and bounds them alike.
type Consumer struct {
	Group          string        `yaml:"group" help:"Kafka consumer group of the service's replicas"`
	SessionTimeout time.Duration `yaml:"session_timeout" help:"consumer group session timeout: how soon the partitions of a crashed replica move to another (or to it, restarted)"`
}

// Validate checks c as the section at path (e.g. "consumer"), naming each
// field with it.
func (c Consumer) Validate(path string) error {
	var errs []error
	if c.Group == "" || len(c.Group) > 249 {
		errs = append(errs, fmt.Errorf("%s.group: %q must be 1..249 bytes", path, c.Group))
	}
	if c.SessionTimeout < 6*time.Second || c.SessionTimeout > 30*time.Minute {
		errs = append(errs, fmt.Errorf("%s.session_timeout: %v is outside 6s..30m (the broker's usual group session limits)", path, c.SessionTimeout))
	}
	return errors.Join(errs...)
}
