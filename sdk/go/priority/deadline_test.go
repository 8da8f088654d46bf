package priority

import (
	"strings"
	"testing"
	"time"
)

func TestDeadlineOf(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	if d, err := DeadlineOf("", now); err != nil || !d.IsZero() {
		t.Fatalf("no header: %v %v, want the zero deadline", d, err)
	}
	if d, err := DeadlineOf("1500", now); err != nil || !d.Equal(now.Add(1500*time.Millisecond)) {
		t.Fatalf("1500: %v %v, want now + 1.5s", d, err)
	}
	for _, bad := range []string{"0", "-5", "1.5", "2s", "3600001", "99999999999999999999"} {
		if _, err := DeadlineOf(bad, now); err == nil || !strings.Contains(err.Error(), TimeoutHeader) || !strings.Contains(err.Error(), "1..3600000") {
			t.Errorf("%q: %v, want an error naming the header and its bounds", bad, err)
		}
	}
}
