package platform

import (
	"strings"
	"testing"
)

// The shared topics are refused at start when one is not a Kafka topic
// name or two are the same topic, each problem naming its setting.
func TestTopicsMustBeThreeKafkaTopicNames(t *testing.T) {
	if err := DefaultTopics().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := Topics{Usage: "team a/usage", Signals: "team-a.events", Admin: "team-a.events"}.Validate()
	for _, want := range []string{`topics.usage: "team a/usage" has ' '`, `topics.admin: "team-a.events" is also topics.signals`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v; want it to say %s", err, want)
		}
	}
	if err := (Topics{Usage: "u"}).Check("usage"); err != nil {
		t.Errorf("a service that uses only topics.usage: %v", err)
	}
	if err := (Topics{Usage: "u"}).Check("signals"); err == nil || !strings.Contains(err.Error(), "topics.signals") {
		t.Errorf("an empty topics.signals: %v; want an error naming it", err)
	}
}
