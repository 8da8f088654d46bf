package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Watcher keeps the current policy of a file, reloading it when its content
// changes. Readers call Current on every event: it is one atomic load.
//
// Polling the content hash (not inotify) is deliberate: it works the same
// for a file edited in place, replaced by rename, or a Kubernetes ConfigMap
// symlink swap, with no extra dependency.
type Watcher struct {
	path     string
	interval time.Duration
	log      *slog.Logger
	cur      atomic.Pointer[Policy]
	mu       sync.Mutex // serialises reloads; guards sum
	sum      [32]byte
	updates  chan *Policy
	opts     []Option

	lastErr atomic.Pointer[string]
	// Reloads and Failures count reload attempts, for metrics.
	Reloads, Failures atomic.Int64
}

// NewWatcher loads path once (failing if it is broken: a service must not
// start without a policy) and returns a watcher that polls it every interval.
// opts apply to every load, the first and each reload.
func NewWatcher(path string, interval time.Duration, log *slog.Logger, opts ...Option) (*Watcher, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data, path, opts...)
	if err != nil {
		return nil, err
	}
	if interval <= 0 {
		interval = 2 * time.Second
	}
	w := &Watcher{path: path, interval: interval, log: log, sum: sourceSum(path, data), updates: make(chan *Policy, 1), opts: opts}
	w.cur.Store(p)
	return w, nil
}

// Static returns a watcher that always serves p and never reloads; for tests
// and for callers that build a policy in code.
func Static(p *Policy) *Watcher {
	w := &Watcher{updates: make(chan *Policy, 1)}
	w.cur.Store(p)
	return w
}

// Current returns the policy in force.
func (w *Watcher) Current() *Policy { return w.cur.Load() }

// Subscribe returns a channel that receives each newly loaded policy. It
// holds only the latest: a slow reader skips intermediate versions, which is
// fine because each policy is complete.
func (w *Watcher) Subscribe() <-chan *Policy { return w.updates }

// Follow polls the file (as Run does) and calls apply with each newly
// loaded policy, in order, until ctx ends. It is how a service reacts to a
// reload; apply runs on Follow's goroutine, so a slow apply delays the next
// one but never the readers of Current.
func (w *Watcher) Follow(ctx context.Context, apply func(*Policy)) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	defer func() { <-done }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-w.updates:
			apply(p)
		}
	}
}

// LastError returns why the most recent reload failed, or "" if it worked.
func (w *Watcher) LastError() string {
	if s := w.lastErr.Load(); s != nil {
		return *s
	}
	return ""
}

// Run polls the file until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	if w.path == "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.Reload()
		}
	}
}

// Reload reads the file now and, if its content changed and parses, makes
// it current. A broken file leaves the previous policy in force, and the
// error is logged and kept for LastError. It reports whether a new policy
// was installed.
func (w *Watcher) Reload() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	data, err := os.ReadFile(w.path)
	if err != nil {
		w.failed(err.Error())
		return false
	}
	sum := sourceSum(w.path, data)
	if bytes.Equal(sum[:], w.sum[:]) {
		return false
	}
	w.Reloads.Add(1)
	p, err := Parse(data, w.path, w.opts...)
	if err != nil {
		w.sum = sum // do not re-log the same broken content every poll
		w.failed(err.Error())
		return false
	}
	w.sum = sum
	empty := ""
	w.lastErr.Store(&empty)
	w.cur.Store(p)
	select {
	case <-w.updates:
	default:
	}
	w.updates <- p
	if w.log != nil {
		w.log.Info("policy reloaded", "file", w.path, "tenants", len(p.tenants))
	}
	return true
}

// sourceSum hashes the policy document and the prices_file it names, so
// that a new prices file (`sluicectl prices import`) reloads the policy as
// an edit of the policy does. An unreadable prices file hashes as absent:
// the parse that follows reports it.
func sourceSum(path string, data []byte) [32]byte {
	h := sha256.New()
	h.Write(data)
	if pf, err := PricesFileOf(data, path); err == nil && pf != "" {
		if prices, err := os.ReadFile(pf); err == nil {
			h.Write([]byte{0})
			h.Write(prices)
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

func (w *Watcher) failed(msg string) {
	w.Failures.Add(1)
	w.lastErr.Store(&msg)
	if w.log != nil {
		w.log.Error("policy reload failed; keeping the previous policy", "file", w.path, "err", msg)
	}
}
