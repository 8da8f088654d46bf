package progress

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

func TestTerminalBarRedrawsInPlace(t *testing.T) {
	var out bytes.Buffer
	clock := &stepClock{t: time.Unix(1000, 0)}
	b := New(&out, "reconcile", 4, Options{Terminal: true, Now: clock.now})
	b.Add(1) // too soon after the start: no redraw
	if out.Len() != 0 {
		t.Fatalf("redrawn before the redraw interval: %q", out.String())
	}
	clock.t = clock.t.Add(time.Second)
	b.Add(1)
	if got := out.String(); !strings.HasPrefix(got, "\rreconcile [") || !strings.Contains(got, "2/4") || !strings.Contains(got, " 50%") {
		t.Fatalf("bar = %q, want a carriage-return bar at 2/4 50%%", got)
	}
	b.Add(2)
	b.Done()
	if got := out.String(); !strings.Contains(got, "4/4 100%") || !strings.HasSuffix(got, "\n") {
		t.Fatalf("final bar = %q, want 4/4 100%% and a newline", got)
	}
}

func TestNonTerminalLogsLines(t *testing.T) {
	var logs, out bytes.Buffer
	clock := &stepClock{t: time.Unix(1000, 0)}
	b := New(&out, "export", 100, Options{Log: slog.New(slog.NewTextHandler(&logs, nil)), LogEvery: 10 * time.Second, Now: clock.now})
	for i := 0; i < 50; i++ {
		clock.t = clock.t.Add(time.Second)
		b.Add(1)
	}
	b.Done()
	if out.Len() != 0 {
		t.Errorf("wrote a bar to a non-terminal: %q", out.String())
	}
	lines := strings.Count(logs.String(), "export in progress")
	if lines != 5 {
		t.Errorf("%d progress lines over 50s at one per 10s, want 5:\n%s", lines, logs.String())
	}
	if !strings.Contains(logs.String(), "export finished") || !strings.Contains(logs.String(), "done=50") {
		t.Errorf("no final line with the count:\n%s", logs.String())
	}
}

func TestBufferIsNotATerminal(t *testing.T) {
	if IsTerminal(&bytes.Buffer{}) {
		t.Fatal("a buffer is not a terminal")
	}
}
