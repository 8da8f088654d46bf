package jsontext

import (
	"bytes"
	"math/bits"
	"testing"
)

// TestStringStops: for every byte value at every position of a word, with
// every kind of byte before it, the lowest mark is the first quote,
// backslash or control character — the word-at-a-time scan stops where
// the byte-at-a-time one would.
func TestStringStops(t *testing.T) {
	special := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	fill := []byte("abcdefgh")
	for pos := range 8 {
		for v := range 256 {
			for _, before := range []byte{'a', 0xC3, 0x7F, 0x20} {
				w := bytes.Repeat([]byte{before}, 8)
				copy(w[pos+1:], fill[pos+1:])
				w[pos] = byte(v)
				want := 8
				for i, c := range w {
					if special(c) {
						want = i
						break
					}
				}
				got := 8
				if m := StringStops(Load64(string(w), 0)); m != 0 {
					got = bits.TrailingZeros64(m) / 8
				}
				if got != want {
					t.Fatalf("word %q: first stop at %d, want %d", w, got, want)
				}
			}
		}
	}
}

// TestNumber holds Number to JSON's number grammar.
func TestNumber(t *testing.T) {
	for _, c := range []struct {
		in      string
		end     int
		problem bool
	}{
		{"0", 1, false}, {"-12,", 3, false}, {"1.5e3}", 5, false}, {"1E+9", 4, false},
		{"01", 1, true}, {"-", 1, true}, {"1.", 2, true}, {"1e", 2, true}, {"1.e3", 2, true}, {"+1", 0, true},
	} {
		end, problem := Number(c.in, 0)
		if end != c.end || (problem != "") != c.problem {
			t.Errorf("Number(%q) = %d, %q; want %d, problem %v", c.in, end, problem, c.end, c.problem)
		}
	}
}
