//go:build race

package schemas

// raceEnabled reports whether the race detector is on, which changes
// allocation counts.
const raceEnabled = true
