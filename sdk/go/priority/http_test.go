package priority

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestWriteRefusal(t *testing.T) {
	for _, c := range []struct {
		d      Decision
		status int
		retry  string
		typ    string
		code   string
		says   string
	}{
		{Decision{Reason: Degraded, Priority: Normal, Level: Level2, RetryAfter: 30 * time.Second}, 503, "30", "server_error", "degraded", "service degraded (level 2: only critical admitted)"},
		{Decision{Reason: Deadline, Priority: Low, Estimate: 2500 * time.Millisecond, RetryAfter: 2500 * time.Millisecond}, 503, "3", "server_error", "deadline", "estimated wait of 2.5s"},
		{Decision{Reason: TenantLimit, Priority: High, RetryAfter: time.Second}, 429, "1", "requests", "rate_limit_exceeded", "too many concurrent requests"},
	} {
		rec := httptest.NewRecorder()
		WriteRefusal(rec, c.d)
		var body struct {
			Error struct {
				Message, Type, Code string
				Sluice              Refusal
			}
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		e := body.Error
		if rec.Code != c.status || rec.Header().Get("Retry-After") != c.retry || e.Type != c.typ || e.Code != c.code || !strings.Contains(e.Message, c.says) || e.Sluice.Reason != c.d.Reason.String() || e.Sluice.Class != string(c.d.Priority) {
			t.Errorf("%v: %d Retry-After %q body %s", c.d.Reason, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	WriteRefusal(rec, Decision{Reason: Admitted})
	if rec.Body.Len() != 0 || rec.Code != http.StatusOK {
		t.Fatal("an admitted decision wrote an answer")
	}
}
