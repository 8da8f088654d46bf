package flagwriter

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway/flags"
)

type noFlags struct{}

func (noFlags) Flags(string, time.Time, time.Duration) map[string]*flags.Flag { return nil }
func (noFlags) Tenants() []string                                             { return nil }

// The dirty set is bounded: past MaxDirty it turns into one full rewrite
// instead of growing.
func TestDirtySetIsBounded(t *testing.T) {
	w := New(nil, noFlags{}, Config{MaxDirty: 3}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.full = false // as after the first successful flush
	w.MarkDirty("a", "b", "c")
	if len(w.dirty) != 3 || w.full {
		t.Fatalf("dirty %v full %v", w.dirty, w.full)
	}
	w.MarkDirty("d")
	if len(w.dirty) != 0 || !w.full {
		t.Fatalf("overflow: dirty %v full %v", w.dirty, w.full)
	}
}
