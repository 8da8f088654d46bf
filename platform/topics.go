package platform

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/schemas"
)

// Topics names the Kafka topics the services of one deployment share (the
// root topics section). Each is declared once, because every service that
// touches a topic must agree on its name: the gateways and ingest produce
// usage events that the aggregator consumes, the aggregator and reconciler
// produce signals that the enforcer and alerter consume, and the enforcer's
// admin API writes the records that the aggregator, reconciler, alerter,
// gateways, console and ingest follow. Topics a single service owns (the
// alerter's state topic, the gateway's deferred queues) stay in that
// service's section.
type Topics struct {
	Usage   string `yaml:"usage" help:"usage events: produced by ingest and the gateways (sink kafka), consumed by the aggregator"`
	Signals string `yaml:"signals" help:"signals: produced by the aggregator and reconciler, consumed by the enforcer and alerter"`
	Admin   string `yaml:"admin" help:"compacted topic of operator actions and runtime records (keys, tenants, plans): written by the enforcer's admin API, read by the enforcer, aggregator, reconciler and alerter and, with their follow_admin, the gateway, console and ingest"`
}

// DefaultTopics returns the topics of the current schema versions.
func DefaultTopics() Topics {
	return Topics{Usage: schemas.TopicUsageV1, Signals: schemas.TopicSignalsV1, Admin: schemas.TopicAdminV1}
}

// maxTopicLen is Kafka's longest topic name.
const maxTopicLen = 249

// Validate checks that each topic is a Kafka topic name and that the three
// differ: a service reading one kind of record from another's topic would
// refuse every record it reads.
func (t Topics) Validate() error {
	errs := []error{t.Check("usage", "signals", "admin")}
	seen := map[string]string{}
	for _, kind := range []string{"usage", "signals", "admin"} {
		name := t.named(kind)
		if other, ok := seen[name]; ok && name != "" {
			errs = append(errs, fmt.Errorf("topics.%s: %q is also topics.%s; each topic carries one kind of record", kind, name, other))
		}
		seen[name] = kind
	}
	return errors.Join(errs...)
}

// Check says which of the named topics ("usage", "signals", "admin") is
// not a Kafka topic name, naming its setting: a service checks the ones it
// uses when it starts, so that an Env built without them fails there.
func (t Topics) Check(kinds ...string) error {
	var errs []error
	for _, kind := range kinds {
		if err := CheckTopicName(t.named(kind)); err != nil {
			errs = append(errs, fmt.Errorf("topics.%s: %w", kind, err))
		}
	}
	return errors.Join(errs...)
}

func (t Topics) named(kind string) string {
	switch kind {
	case "usage":
		return t.Usage
	case "signals":
		return t.Signals
	case "admin":
		return t.Admin
	}
	panic("platform: no topic kind " + kind)
}

// CheckTopicName says why name cannot be a Kafka topic, or returns nil.
func CheckTopicName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > maxTopicLen {
		return fmt.Errorf("%q must be a Kafka topic name of 1 to %d characters (not . or ..)", name, maxTopicLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q has %q; a Kafka topic name has only letters, digits, '.', '_' and '-'", name, r)
		}
	}
	return nil
}
