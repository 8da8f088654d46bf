package audit

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// TestModelsFoldedIntoOtherAreNoDrift: a tenant beyond max_models has
// usage_minute rows for its first models, "other" (the rest) and "*";
// the raw events name every model. The comparison credits the models
// without rows of their own to "other": no drift, no cell per folded model.
func TestModelsFoldedIntoOtherAreNoDrift(t *testing.T) {
	at := time.Date(2026, 3, 10, 15, 30, 0, 0, time.UTC)
	one := usage{requests: 1, prompt: 10, completion: 5}
	tr := truth{}
	for _, m := range []string{"m0", "m1", "m2", "m3", "m4"} {
		tr[m] = map[int64]usage{at.Unix(): one}
	}
	times := func(n uint64) usage {
		return usage{requests: n, prompt: 10 * n, completion: 5 * n}
	}
	mrows := []minuteRow{{model: "m0", minute: at, u: one}, {model: "m1", minute: at, u: one},
		{model: policy.OtherModel, minute: at, u: times(3)}, {model: policy.AllModels, minute: at, u: times(5)}}
	cells := map[string]*cell{}
	(&Auditor{}).minuteCells(cells, tr, mrows, schemas.PeriodDay, at.Truncate(24*time.Hour), at.Truncate(24*time.Hour).Add(24*time.Hour))
	for k, c := range cells {
		if c.drifted {
			t.Errorf("%s drifted: counter %v truth %v", k, c.row.Counter, c.row.Truth)
		}
		if c.row.Model == "m2" || c.row.Model == "m3" || c.row.Model == "m4" {
			t.Errorf("a cell for folded model %s: %s", c.row.Model, k)
		}
	}
	if len(cells) != 8 { // 4 models × (minute + summary)
		t.Errorf("%d cells, want 8", len(cells))
	}
	// Without "other" rows nothing is folded: a model missing its rows is drift.
	cells = map[string]*cell{}
	(&Auditor{}).minuteCells(cells, tr, mrows[:2], schemas.PeriodDay, at.Truncate(24*time.Hour), at.Truncate(24*time.Hour).Add(24*time.Hour))
	if c := cells["m|m2|"+strconv.FormatInt(at.Unix(), 10)]; c == nil || !c.drifted {
		t.Errorf("m2 without rows and without an other bucket must be drift: %+v", c)
	}
}
