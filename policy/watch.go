package policy

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/sdk/go/periodic"
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
	sum      string     // fingerprintOf the content last parsed
	// prices is the prices file of the content sum covers: the policy
	// in force's, or the one a broken reload named (so that providing
	// the missing file reloads). Guarded by mu.
	prices  string
	updates chan *Policy
	opts    []Option
	// data is the file content in force, overlay the admin API's tenants
	// and plans laid over it (SetOverlay); guarded by mu.
	data    []byte
	overlay Overlay
	// name names data in errors: the file's path, or FromData's name.
	name string
	// fileSecs are data's own tenants and plans (setData), so that a
	// reader of them (the console, on every tenant page) reads no file.
	fileSecs atomic.Pointer[fileSections]
	// records are the overlay's records as the last merge decoded them.
	records recordCache

	conflicts atomic.Pointer[[]string]

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
	w := &Watcher{path: path, interval: interval, log: log, sum: p.Fingerprint(), prices: p.PricesFile(), updates: make(chan *Policy, 1), opts: opts, name: path}
	w.setData(data, w.sectionsOf(data))
	w.cur.Store(p)
	w.conflicts.Store(&[]string{})
	return w, nil
}

// Static returns a watcher that always serves p and never reloads; for tests
// and for callers that build a policy in code.
func Static(p *Policy) *Watcher {
	w := &Watcher{updates: make(chan *Policy, 1)}
	w.cur.Store(p)
	w.conflicts.Store(&[]string{})
	return w
}

// FromData returns a watcher of a policy given as data (named name in
// errors) rather than a file: it never reloads, and lays an overlay over
// data (SetOverlay) as NewWatcher's does over its file. A service without
// a policy file serves the built-in defaults this way.
func FromData(data []byte, name string, opts ...Option) (*Watcher, error) {
	p, err := Parse(data, name, opts...)
	if err != nil {
		return nil, err
	}
	w := &Watcher{updates: make(chan *Policy, 1), opts: opts, name: name}
	w.setData(data, w.sectionsOf(data))
	w.cur.Store(p)
	w.conflicts.Store(&[]string{})
	return w, nil
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
	periodic.Every(ctx, w.interval, func() { w.Reload() })
	return nil
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
	sum := sourceSum(data, w.prices)
	if sum == w.sum {
		return false
	}
	w.Reloads.Add(1)
	p, err := Parse(data, w.path, w.opts...)
	if err != nil {
		w.sum = sum // do not re-log the same broken content every poll
		if pf, perr := PricesFileOf(data, w.path); perr == nil {
			w.prices = pf
			w.sum = sourceSum(data, pf)
		}
		w.failed(err.Error())
		return false
	}
	// The prices the parse read, not a second reading that may be newer.
	w.sum, w.prices = p.Fingerprint(), p.PricesFile()
	if !w.install(data, w.overlay, p) {
		// The file parses alone but not with the records: keep the
		// file's own content for the next overlay, the policy as it was.
		w.setData(data, w.sectionsOf(data))
		return false
	}
	if w.log != nil {
		w.log.Info("policy reloaded", "file", w.path, "tenants", len(w.Current().tenants))
	}
	return true
}

// SetOverlay lays o (the admin API's tenants and plans) over the file in
// force and installs the result as Reload does; a merge that does not
// validate keeps the policy in force, logs why and keeps it for LastError,
// and a tenant both define differently is reported (Conflicts). It reports
// whether a new policy was installed. A Static watcher has no file to lay
// o over and ignores it.
func (w *Watcher) SetOverlay(o Overlay) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.data == nil || o.equal(w.overlay) {
		return false
	}
	w.overlay = o
	return w.install(w.data, o, nil)
}

// Check returns why o laid over the file in force would not validate (each
// problem naming its field), or nil: the admin API checks a change with it
// before making it.
func (w *Watcher) Check(o Overlay) error {
	w.mu.Lock()
	data := w.data
	f := w.fileSecs.Load()
	w.mu.Unlock()
	if data == nil {
		return nil
	}
	_, conflicts, err := w.overlaid(data, o, f)
	if err != nil {
		return err
	}
	// A record the file also defines, differently, is not in force (the
	// file's is), but it must be valid in the file's place all the same.
	for _, c := range conflicts {
		where, name, _ := strings.Cut(c, ".")
		without, err := withoutSection(data, where, name)
		if err != nil {
			return err
		}
		if _, _, err := Overlaid(without, w.name, o, w.opts...); err != nil {
			return err
		}
	}
	return nil
}

// FileSections returns the tenants and plans the file in force defines
// (SectionsOf of its content), as of the last reload: computed once per
// change of the file, not per call. The maps are shared: do not modify
// them. A Static watcher has no file and returns none.
func (w *Watcher) FileSections() (Overlay, error) {
	if f := w.fileSecs.Load(); f != nil {
		return f.sections, f.err
	}
	return Overlay{}, nil
}

// fileSections is SectionsOf of one content of the file.
type fileSections struct {
	sections Overlay
	err      error
}

// sectionsOf returns data's sections: those of the file in force when
// data is its content, else computed.
func (w *Watcher) sectionsOf(data []byte) *fileSections {
	if f := w.fileSecs.Load(); f != nil && bytes.Equal(w.data, data) {
		return f
	}
	o, err := SectionsOf(data)
	return &fileSections{sections: o, err: err}
}

// setData makes data, whose sections are f, the file's content in force;
// with mu held (or before w is shared).
func (w *Watcher) setData(data []byte, f *fileSections) {
	w.data = data
	w.fileSecs.Store(f)
}

// overlaid is Overlaid of data with o, from data's sections f and the
// records the watcher's last merge decoded.
func (w *Watcher) overlaid(data []byte, o Overlay, f *fileSections) (*Policy, []string, error) {
	var file *Overlay
	if f.err == nil {
		file = &f.sections
	}
	return overlaid(data, w.name, o, file, &w.records, w.opts...)
}

// Overlay returns the overlay last set.
func (w *Watcher) Overlay() Overlay {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overlay
}

// Conflicts returns the tenants and plans ("tenants.NAME", "plans.NAME")
// that both the file and the overlay define, differently, at the last
// install: the file's definition is the one in force.
func (w *Watcher) Conflicts() []string { return slices.Clone(*w.conflicts.Load()) }

// install makes data with o current and publishes it; with mu held.
// parsed, when not nil, is data parsed alone, which serves as is when o is
// empty.
func (w *Watcher) install(data []byte, o Overlay, parsed *Policy) bool {
	f := w.sectionsOf(data)
	p, conflicts, err := parsed, []string(nil), error(nil)
	if p == nil || !o.Empty() {
		p, conflicts, err = w.overlaid(data, o, f)
	}
	if conflicts == nil {
		conflicts = []string{}
	}
	if err != nil {
		w.failed("with the admin API's tenants and plans: " + err.Error())
		return false
	}
	w.setData(data, f)
	w.conflicts.Store(&conflicts)
	if len(conflicts) > 0 && w.log != nil {
		w.log.Error("tenants or plans defined both in the policy file and through the admin API, differently: the file's definition is in force; make them equal (sluicectl policy apply) or remove one (docs/controlplane.md)",
			"file", w.path, "conflicts", conflicts)
	}
	empty := ""
	w.lastErr.Store(&empty)
	w.cur.Store(p)
	select {
	case <-w.updates:
	default:
	}
	w.updates <- p
	return true
}

// sourceSum is the fingerprint data would parse to with the prices file
// pricesFile as it is now, so that a new prices file (`sluicectl prices
// import`) reloads the policy as an edit of the policy does. The path is
// the policy's last parse's, not data parsed again at every poll: a
// document that changes prices_file changes data, and its parse reads the
// new file. An unreadable prices file hashes as absent: the parse that
// follows reports it.
func sourceSum(data []byte, pricesFile string) string {
	var prices []byte
	if pricesFile != "" {
		prices, _ = os.ReadFile(pricesFile)
	}
	return fingerprintOf(data, prices)
}

func (w *Watcher) failed(msg string) {
	w.Failures.Add(1)
	w.lastErr.Store(&msg)
	if w.log != nil {
		w.log.Error("policy reload failed; keeping the previous policy", "file", w.path, "err", msg)
	}
}
