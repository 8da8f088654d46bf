package engine

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// Route is where and how one tenant's alerts are delivered.
type Route struct {
	// Channels names the channels: "alertmanager" or "<kind>:<name>"
	// (dingtalk:ops). Empty means the alert is tracked but sent nowhere.
	Channels []string
	// Language is "en" or "zh".
	Language string
	// Location is the tenant's time zone, which quiet hours are read in.
	Location *time.Location
	// QuietHours, when set, hold back notifications below its Allow
	// severity during a daily window; they are delivered when the window
	// ends if the alert is still firing.
	QuietHours *QuietHours
	// Silences hold back matching notifications until they expire.
	Silences []Silence
}

// Router returns a tenant's route. It is called on every delivery, so a
// hot-reloaded policy takes effect without restarting the alerter.
type Router func(tenant string) Route

// QuietHours is a daily window, in the tenant's zone, in which only alerts
// of Allow severity or above are delivered.
type QuietHours struct {
	// Start and End are minutes after midnight; End before Start means the
	// window spans midnight (22:00–08:00).
	Start, End int
	// Allow is the lowest severity still delivered during the window.
	Allow alert.Severity
}

// ParseClock parses "HH:MM" into minutes after midnight.
func ParseClock(s string) (int, error) {
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a time of day HH:MM (00:00 to 23:59)", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// contains reports whether t, read in loc, falls in the window.
func (q *QuietHours) contains(t time.Time, loc *time.Location) bool {
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	m := lt.Hour()*60 + lt.Minute()
	switch {
	case q.Start == q.End:
		return false
	case q.Start < q.End:
		return m >= q.Start && m < q.End
	default:
		return m >= q.Start || m < q.End
	}
}

// Silence holds back the notifications of matching alerts until Until.
type Silence struct {
	// Rule and Model restrict the silence; empty matches any.
	Rule  alert.Rule
	Model string
	Until time.Time
}

func (s *Silence) matches(k alert.Key, now time.Time) bool {
	return now.Before(s.Until) && (s.Rule == "" || s.Rule == k.Rule) && (s.Model == "" || s.Model == k.Model)
}

// suppressed reports why a notification of a must wait now, or "" when it
// may go out.
func (r *Route) suppressed(a *alert.Alert, now time.Time) string {
	for i := range r.Silences {
		if r.Silences[i].matches(a.Key, now) {
			return "silenced"
		}
	}
	if r.QuietHours != nil && a.Severity < r.QuietHours.Allow && r.QuietHours.contains(now, r.Location) {
		return "quiet hours"
	}
	return ""
}
