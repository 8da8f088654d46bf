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
	w := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			b := w.bytes()
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("services' log (tail):\n%s", b)
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// lockedBuffer is a bytes.Buffer safe for the services' goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *lockedBuffer) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}
