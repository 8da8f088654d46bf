package priority

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// TestDegraderLevelsFollowSeed003: above 50% load only high and above are
// admitted, above 70% only critical, above 90% nothing; a degraded
// refusal says so with 503 and Retry-After 30 s.
func TestDegraderLevelsFollowSeed003(t *testing.T) {
	d, err := NewDegrader()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		load   float64
		level  Level
		admits []schemas.Priority
	}{
		{0.50, LevelNone, []schemas.Priority{Low, Normal, High, Critical}},
		{0.51, Level1, []schemas.Priority{High, Critical}},
		{0.71, Level2, []schemas.Priority{Critical}},
		{0.91, Level3, nil},
	} {
		if got := d.Update(c.load); got != c.level {
			t.Fatalf("load %v: level %d, want %d", c.load, got, c.level)
		}
		for _, cl := range schemas.Priorities {
			dec, ok := d.Check(cl)
			want := false
			for _, a := range c.admits {
				want = want || a == cl
			}
			if ok != want {
				t.Errorf("load %v, %s: admitted %v, want %v", c.load, cl, ok, want)
			}
			if !ok && (dec.Reason != Degraded || dec.Status() != 503 || dec.RetryAfter != 30*time.Second || dec.Level != c.level) {
				t.Errorf("load %v, %s: refusal %+v", c.load, cl, dec)
			}
		}
	}
	ref, _ := d.Check(High)
	if msg := ref.Message(); !strings.Contains(msg, "service degraded (level 3: nothing admitted)") || !strings.Contains(msg, "retry after 30s") {
		t.Fatalf("message %q", msg)
	}
}

// TestDegraderHysteresis: a level is left only once the load is 5 points
// under its threshold, so a load hovering at 70% does not flap.
func TestDegraderHysteresis(t *testing.T) {
	d, err := NewDegrader()
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		load float64
		want Level
	}{{0.75, Level2}, {0.69, Level2}, {0.66, Level2}, {0.65, Level1}, {0.95, Level3}, {0.30, LevelNone}, {0.55, Level1}, {0.46, Level1}, {0.45, LevelNone}}
	for _, s := range steps {
		if got := d.Update(s.load); got != s.want {
			t.Fatalf("load %v: level %d, want %d", s.load, got, s.want)
		}
	}
}

func TestDegraderOptionsAreValidated(t *testing.T) {
	_, err := NewDegrader(Thresholds(0.7, 0.5, 0.9), DegradedRetryAfter(0))
	if err == nil || !strings.Contains(err.Error(), "Thresholds: 0.7, 0.5, 0.9 must increase") || !strings.Contains(err.Error(), "DegradedRetryAfter: 0s") {
		t.Fatalf("error %v", err)
	}
}
