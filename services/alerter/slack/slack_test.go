package slack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/message/messagetest"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

func renderer(t *testing.T) *message.Renderer {
	return messagetest.Renderer(t, message.Links{Runbook: "https://rb.example/{rule}"})
}

func sample() alert.Message {
	return alert.Message{Alerts: []alert.Alert{{Key: alert.Key{Tenant: "acme", Model: "gpt-4o", Period: "month", Quota: "monthly_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: alert.SeverityWarning, Tier: 90, Used: 900, Limit: 1000, Unit: "tokens"}}}
}

func TestSendsBlocks(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, "invalid_payload", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	s, err := New(srv.URL+"/services/T/B/X", renderer(t), srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), sample()); err != nil {
		t.Fatal(err)
	}
	blocks, _ := got["blocks"].([]any)
	if len(blocks) != 3 || !strings.Contains(got["text"].(string), "acme") {
		t.Fatalf("payload %v", got)
	}
	header := blocks[0].(map[string]any)
	section := blocks[1].(map[string]any)
	if header["type"] != "header" || header["text"].(map[string]any)["type"] != "plain_text" ||
		section["type"] != "section" || section["text"].(map[string]any)["type"] != "mrkdwn" ||
		!strings.Contains(section["text"].(map[string]any)["text"].(string), "<https://rb.example/quota_tier|runbook>") {
		t.Fatalf("blocks %v", blocks)
	}
}

func TestStatusCodesMapToRetryPolicy(t *testing.T) {
	for _, c := range []struct {
		status    int
		permanent bool
	}{{500, false}, {503, false}, {429, false}, {400, true}, {404, true}, {403, true}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "x", c.status)
		}))
		s, _ := New(srv.URL, renderer(t), srv.Client())
		err := s.Send(context.Background(), sample())
		srv.Close()
		if err == nil || notify.IsPermanent(err) != c.permanent {
			t.Errorf("status %d: err %v, permanent=%v want %v", c.status, err, notify.IsPermanent(err), c.permanent)
		}
	}
}

func TestLongTextIsCutToSlackLimits(t *testing.T) {
	var got Payload
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
	}))
	defer srv.Close()
	s, _ := New(srv.URL, renderer(t), srv.Client())
	m := sample()
	m.Alerts[0].Reason = strings.Repeat("very long reason ", 400)
	if err := s.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if n := len(got.Blocks[1].Text.Text); n > MaxSection || n == 0 {
		t.Fatalf("section is %d bytes", n)
	}
}

func TestLongListsAreSplitIntoSections(t *testing.T) {
	var lines []string
	for i := 0; i < 200; i++ {
		lines = append(lines, fmt.Sprintf("- tenant-%03d / gpt-4o: used 1,000,000 of 1,000,000 tokens (100.0%%)", i))
	}
	parts := sections(strings.Join(lines, "\n"))
	if len(parts) < 2 || len(parts) > MaxSections {
		t.Fatalf("%d sections", len(parts))
	}
	joined := strings.Join(parts, "\n")
	for _, p := range parts {
		if len(p) > MaxSection {
			t.Fatalf("section of %d bytes", len(p))
		}
	}
	if !strings.Contains(joined, "tenant-000") || !strings.Contains(joined, "tenant-199") || strings.Count(joined, "\n") != 199 {
		t.Fatal("lines lost or split between sections")
	}
}
