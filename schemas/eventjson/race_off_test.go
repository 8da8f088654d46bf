//go:build !race

package eventjson

// raceEnabled reports whether the race detector is on, which changes
// allocation counts.
const raceEnabled = false
