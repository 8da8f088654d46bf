package sidebyside

import (
	"cmp"
	"slices"
	"time"
)

// slidingOvershoot is the worst key's admissions above limit in any span
// shorter than span, as a share of limit. The load generator knows only
// that an admission was decided between sending the request and reading
// the answer; on a busy machine the answer may be read many milliseconds
// later, and timestamps taken then bunch admissions of adjacent spans
// together. So an admission counts in a span only when both ends lie
// within it: the overshoot the limiter certainly made (every limiter is
// judged so).
func slidingOvershoot(events []event, keys int, limit int64, span time.Duration) float64 {
	perKey := make([][]event, keys)
	for _, e := range events {
		perKey[e.key] = append(perKey[e.key], e)
	}
	var worst int64
	for _, ev := range perKey {
		slices.SortFunc(ev, func(a, b event) int { return cmp.Compare(a.sent, b.sent) })
		for i := range ev {
			end := ev[i].sent + int64(span)
			var n int64
			for j := i; j < len(ev) && ev[j].sent < end; j++ {
				if ev[j].at < end {
					n++
				}
			}
			worst = max(worst, n)
		}
	}
	return float64(max(worst-limit, 0)) / float64(limit)
}

// fixedOvershoot is the worst key's admissions above limit in one of the
// fixed windows the limiter said it counted them in, as a share of limit.
func fixedOvershoot(events []event, limit int64) float64 {
	perWindow := map[[2]int64]int64{}
	var worst int64
	for _, e := range events {
		w := [2]int64{int64(e.key), e.reset}
		perWindow[w]++
		worst = max(worst, perWindow[w])
	}
	return float64(max(worst-limit, 0)) / float64(limit)
}

// alignedOvershoot is the worst key's admissions above limit in one of the
// clock-aligned fixed windows of length window, as a share of limit. Like
// slidingOvershoot it counts an admission only where the limiter certainly
// made it: in the window that holds both the request's sending and its
// answer's reading; one that spans two windows may have been counted in
// either, and counts in neither.
func alignedOvershoot(events []event, limit int64, window time.Duration) float64 {
	perWindow := map[[2]int64]int64{}
	var worst int64
	for _, e := range events {
		w := e.sent / int64(window)
		if e.at/int64(window) != w {
			continue
		}
		k := [2]int64{int64(e.key), w}
		perWindow[k]++
		worst = max(worst, perWindow[k])
	}
	return float64(max(worst-limit, 0)) / float64(limit)
}
