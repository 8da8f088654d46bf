// Package jsontext holds the byte-level pieces of JSON's grammar that the
// hand-written decoders of package schemas (signals) and schemas/eventjson
// (usage events) share: whitespace, numbers and the eight-bytes-at-a-time
// scan of a string's plain run. Each works on a string and an offset and
// allocates nothing, so that it inlines into the decoders' loops.
package jsontext

// LowBits and HighBits are the lowest and highest bit of each of a word's
// eight bytes.
const (
	LowBits  = 0x0101010101010101
	HighBits = 0x8080808080808080
)

// Load64 reads eight bytes of s from i, little-endian; the compiler turns
// it into one load.
func Load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// StringStops sets the high bit of each byte of w that ends a string's
// plain run: a quote, a backslash or a control character. Bytes above the
// lowest marked one may be marked falsely (a borrow runs upwards), so
// callers use only the lowest mark.
func StringStops(w uint64) uint64 {
	q := w ^ (LowBits * '"')
	b := w ^ (LowBits * '\\')
	return ((q-LowBits)&^q | (b-LowBits)&^b | (w-LowBits*0x20)&^w) & HighBits
}

// SkipWS returns the offset of the first byte of s at or after i that is
// not one of the four whitespace bytes JSON allows.
func SkipWS(s string, i int) int {
	// Compact JSON has no whitespace between tokens: check that first.
	if i < len(s) && s[i] > ' ' {
		return i
	}
	for i < len(s) {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// IsHex reports whether c is a hexadecimal digit.
func IsHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// Number checks the number that starts at s[i] against JSON's grammar and
// returns the offset just past it; when it is not one, problem says why
// and end is where the problem is.
func Number(s string, i int) (end int, problem string) {
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
		if i < len(s) && s[i] >= '0' && s[i] <= '9' {
			return i, "invalid number: JSON does not allow leading zeros"
		}
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = skipDigits(s, i)
	default:
		return i, "invalid number; JSON numbers look like 0, -12 or 1.5e3"
	}
	if i < len(s) && s[i] == '.' {
		j := i + 1
		if i = skipDigits(s, j); i == j {
			return i, "invalid number: a digit must follow the decimal point"
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := i
		if i = skipDigits(s, j); i == j {
			return i, "invalid number: a digit must follow the exponent"
		}
	}
	return i, ""
}

// skipDigits returns the offset of the first byte of s at or after i that
// is not an ASCII digit.
func skipDigits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
