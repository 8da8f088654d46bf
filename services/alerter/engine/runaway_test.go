package engine

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// runawayRecorder keeps the simulated times at which a firing
// exhaustion_predicted notice left.
type runawayRecorder struct {
	now    *time.Time
	firing []time.Time
}

func (r *runawayRecorder) Deliver(_ string, m alert.Message) {
	for _, a := range m.Alerts {
		if a.Key.Rule == alert.RuleExhaustionPredicted && a.Status == alert.StatusFiring && !m.Resend {
			r.firing = append(r.firing, *r.now)
		}
	}
}

// TestRunawayIsAlertedBeforeNinetyPercent replays, second by second, the
// signals the aggregator gives a tenant that uses up its 500,000-token
// hour in 90 s (schemas/testdata/runaway-signals.json, which the
// aggregator's TestRunawayIsPredictedWithinFifteenSeconds keeps current):
// a firing exhaustion_predicted alert must leave before the tenant has
// used 90% of its quota, with the default pending_for (1m) as with the
// demo's (5s).
func TestRunawayIsAlertedBeforeNinetyPercent(t *testing.T) {
	data, err := os.ReadFile("../../../schemas/testdata/runaway-signals.json")
	if err != nil {
		t.Fatal(err)
	}
	var steps []struct {
		Now     time.Time        `json:"now"`
		Used    float64          `json:"used"`
		Signals []schemas.Signal `json:"signals"`
	}
	if err := json.Unmarshal(data, &steps); err != nil || len(steps) < 60 {
		t.Fatalf("the runaway's signals: %d steps, %v", len(steps), err)
	}
	for _, pending := range []time.Duration{5 * time.Second, time.Minute} {
		t.Run("pending_for="+pending.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.PendingFor, cfg.GroupWait = pending, 0
			var now time.Time
			rec := &runawayRecorder{now: &now}
			e, err := New(cfg, func(string) Route {
				return Route{Channels: []string{AlertmanagerChannel}, Language: "en", Location: time.UTC}
			}, rec)
			if err != nil {
				t.Fatal(err)
			}
			usedAtAlert := -1.0
			for _, st := range steps {
				now = st.Now
				for i := range st.Signals {
					e.Observe(&st.Signals[i], now)
				}
				e.Tick(now)
				if len(rec.firing) > 0 {
					usedAtAlert = st.Used
					break
				}
			}
			if usedAtAlert < 0 || usedAtAlert >= 0.9 {
				t.Errorf("exhaustion_predicted fired at %.0f%% used, want before 90%%", 100*usedAtAlert)
			}
		})
	}
}
