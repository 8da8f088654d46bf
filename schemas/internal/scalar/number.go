package scalar

import "strconv"

// maxExponent bounds the exponent of a number the decoders evaluate. Integer
// fields never need one, and a huge exponent ("0e999999999") costs other
// JSON tools (arbitrary-precision validators) unbounded time.
const maxExponent = 400

// ParseInt converts a JSON number, already checked against JSON's grammar,
// to an int64. Like JSON Schema's "integer", it accepts any number whose
// value is whole, so 12, 12.0 and 1.2e1 are all twelve. On failure it returns
// a reason that names max and limitName, the field's own bound, because that
// is the number the sender needs to hear about.
func ParseInt(num string, max int64, limitName string) (int64, string) {
	// Fast path: a plain integer, which is what every encoder sends.
	neg := false
	s := num
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	if len(s) <= 18 {
		var v int64
		i := 0
		for ; i < len(s); i++ {
			c := s[i]
			if c < '0' || c > '9' {
				break
			}
			v = v*10 + int64(c-'0')
		}
		if i == len(s) {
			if neg {
				v = -v
			}
			return v, ""
		}
	}
	return parseIntSlow(num, neg, s, max, limitName)
}

// parseIntSlow handles long integers, fractions and exponents exactly, on
// the decimal digits, so that no float rounding can turn 1.0000000000000001
// into an integer.
func parseIntSlow(num string, neg bool, s string, max int64, limitName string) (int64, string) {
	outOfRange := func() (int64, string) {
		return 0, "is " + Shorten(num) + ", out of range; the maximum is " + strconv.FormatInt(max, 10) + " (" + limitName + ")"
	}
	// Split into integer digits, fraction digits and exponent.
	intPart, frac, exp := s, "", 0
	for i := 0; i < len(s); i++ {
		if s[i] == '.' || s[i] == 'e' || s[i] == 'E' {
			intPart = s[:i]
			rest := s[i:]
			if rest[0] == '.' {
				j := 1
				for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
					j++
				}
				frac, rest = rest[1:j], rest[j:]
			}
			if rest != "" { // exponent
				e := rest[1:]
				eneg := false
				if e[0] == '+' || e[0] == '-' {
					eneg = e[0] == '-'
					e = e[1:]
				}
				for len(e) > 1 && e[0] == '0' {
					e = e[1:]
				}
				if len(e) > 3 {
					return 0, "is " + Shorten(num) + ", whose exponent is beyond ±" + strconv.Itoa(maxExponent) + "; send a plain integer"
				}
				exp, _ = strconv.Atoi(e)
				if exp > maxExponent {
					return 0, "is " + Shorten(num) + ", whose exponent is beyond ±" + strconv.Itoa(maxExponent) + "; send a plain integer"
				}
				if eneg {
					exp = -exp
				}
			}
			break
		}
	}
	// The value is mant × 10^exp with mant the significant digits.
	mant := intPart + frac
	exp -= len(frac)
	for len(mant) > 0 && mant[0] == '0' {
		mant = mant[1:]
	}
	for len(mant) > 0 && mant[len(mant)-1] == '0' {
		mant = mant[:len(mant)-1]
		exp++
	}
	if mant == "" {
		return 0, ""
	}
	if exp < 0 {
		return 0, "is " + Shorten(num) + ", not a whole number; send an integer"
	}
	if len(mant)+exp > 19 {
		return outOfRange()
	}
	var v uint64
	for i := 0; i < len(mant); i++ {
		v = v*10 + uint64(mant[i]-'0')
	}
	for ; exp > 0; exp-- {
		v *= 10
	}
	// 19 digits fit in a uint64 but not all of them in an int64.
	if v > 1<<63-1 {
		return outOfRange()
	}
	if neg {
		return -int64(v), ""
	}
	return int64(v), ""
}

// Shorten keeps error messages readable when a value is absurdly long: it
// cuts s to 40 bytes.
func Shorten(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}
