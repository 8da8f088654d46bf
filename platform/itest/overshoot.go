package itest

import (
	"cmp"
	"slices"
	"time"
)

// MostInSpan is the most units admitted in any span shorter than span:
// events are [unix ns, units] of each admission, as the load generator
// counted them itself, in any order (they are sorted in place). A limit of
// L per window w was overshot by MostInSpan(events, w) - L.
func MostInSpan(events [][2]int64, span time.Duration) int64 {
	slices.SortFunc(events, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var best, sum int64
	j := 0
	for i := range events {
		sum += events[i][1]
		for events[i][0]-events[j][0] >= int64(span) {
			sum -= events[j][1]
			j++
		}
		best = max(best, sum)
	}
	return best
}
