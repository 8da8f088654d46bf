// Package progress reports how far a long run (a reconciliation of every
// tenant, a month's export) has come: a bar redrawn in place when the
// output is a terminal, and a log line every so often otherwise, so that
// a run under cron or systemd leaves a readable trail instead of
// carriage-return noise.
package progress

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// IsTerminal reports whether w is a character device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Options adjust a Bar.
type Options struct {
	// Terminal selects the redrawn bar; otherwise Log gets lines.
	Terminal bool
	// Redraw is the minimum time between two bar redraws (default 100ms).
	Redraw time.Duration
	// LogEvery is the minimum time between two log lines (default 10s).
	LogEvery time.Duration
	// Log receives the lines when not on a terminal; nil means slog.Default.
	Log *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Bar tracks done out of total steps. It is safe for concurrent use.
type Bar struct {
	w     io.Writer
	label string
	total int
	opt   Options

	mu      sync.Mutex
	done    int
	started time.Time
	last    time.Time
}

// New starts a Bar over total steps that writes to w (the bar) or to
// opt.Log (the lines).
func New(w io.Writer, label string, total int, opt Options) *Bar {
	if opt.Redraw <= 0 {
		opt.Redraw = 100 * time.Millisecond
	}
	if opt.LogEvery <= 0 {
		opt.LogEvery = 10 * time.Second
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	now := opt.Now()
	return &Bar{w: w, label: label, total: total, opt: opt, started: now, last: now}
}

// Add records n more steps done and redraws or logs when it is time to.
func (b *Bar) Add(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	now := b.opt.Now()
	every := b.opt.LogEvery
	if b.opt.Terminal {
		every = b.opt.Redraw
	}
	// A terminal bar always shows its last step; a log gets it from Done.
	full := b.opt.Terminal && b.done >= b.total
	if now.Sub(b.last) < every && !full {
		return
	}
	b.last = now
	b.emit(now, false)
}

// Done writes the final state: the full bar and a newline, or a last line.
func (b *Bar) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.emit(b.opt.Now(), true)
}

func (b *Bar) emit(now time.Time, final bool) {
	elapsed := now.Sub(b.started).Round(time.Second)
	var eta time.Duration
	if b.done > 0 && b.done < b.total {
		eta = (now.Sub(b.started) * time.Duration(b.total-b.done) / time.Duration(b.done)).Round(time.Second)
	}
	if !b.opt.Terminal {
		if final {
			b.opt.Log.Info(b.label+" finished", "done", b.done, "total", b.total, "elapsed", elapsed.String())
		} else {
			b.opt.Log.Info(b.label+" in progress", "done", b.done, "total", b.total, "elapsed", elapsed.String(), "eta", eta.String())
		}
		return
	}
	const width = 30
	frac := 1.0
	if b.total > 0 {
		frac = float64(b.done) / float64(b.total)
	}
	if frac > 1 {
		frac = 1
	}
	filled := int(frac * width)
	line := fmt.Sprintf("\r%s [%s%s] %d/%d %3.0f%% elapsed %s", b.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		b.done, b.total, frac*100, elapsed)
	if eta > 0 {
		line += " eta " + eta.String()
	}
	if final {
		line += "\n"
	}
	// Progress is best effort: a closed stderr must not fail the run.
	_, _ = io.WriteString(b.w, line)
}
