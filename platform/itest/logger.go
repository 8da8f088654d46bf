package itest

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Logger returns a logger for the services a test runs in its own process.
// What they log is kept in memory and shown (its last 20,000 bytes) only if
// the test fails: quiet on success, the services' side of the story on
// failure.
func Logger(t testing.TB) *slog.Logger {
	t.Helper()
	w := &Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			b := w.Bytes()
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("services' log (tail):\n%s", b)
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Buffer is a bytes.Buffer that services' goroutines write while a test
// reads it: the sink for a service's log or a command's output.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p; it never fails.
func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// Bytes returns a copy of everything written so far.
func (w *Buffer) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// String returns everything written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
