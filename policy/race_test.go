//go:build race

package policy

// raceEnabled: the race detector slows the every-zone period walk tenfold
// and finds nothing in a pure function, so it walks the short range.
const raceEnabled = true
