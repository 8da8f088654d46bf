package itest

import (
	"slices"
	"time"
)

// Percentile returns the p-th quantile (0 ≤ p ≤ 1) of the durations a
// benchmark measured, by nearest rank: the smallest sample at or above a
// share p of them (the largest for p = 1). d is not reordered; an empty d
// is 0.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
