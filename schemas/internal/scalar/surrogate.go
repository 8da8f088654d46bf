package scalar

// LoneSurrogateReason is the problem of a string that escapes half of a
// UTF-16 surrogate pair alone ("\ud800"): well-formed JSON, but not Unicode
// text, so no decoder may turn it into a string silently.
const LoneSurrogateReason = `contains a lone UTF-16 surrogate escape; pair \uD800-\uDBFF with \uDC00-\uDFFF or send the character in UTF-8`

// LoneSurrogate reports whether lit, a well-formed JSON string literal
// quotes included, has a lone surrogate escape. encoding/json would turn it
// into U+FFFD without a word.
func LoneSurrogate(lit string) bool {
	for i := 0; i+5 < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		if lit[i+1] != 'u' {
			i++ // the escaped byte, which may be a backslash
			continue
		}
		r := hex4(lit[i+2 : i+6])
		i += 5
		switch {
		case r < 0xD800 || r > 0xDFFF:
		case r >= 0xDC00:
			return true // a low half first
		case i+6 < len(lit) && lit[i+1] == '\\' && lit[i+2] == 'u' && isLow(hex4(lit[i+3:i+7])):
			i += 6
		default:
			return true
		}
	}
	return false
}

func isLow(r rune) bool { return r >= 0xDC00 && r <= 0xDFFF }

// hex4 reads four hex digits, which a well-formed literal has after \u.
func hex4(b string) rune {
	var r rune
	for _, c := range []byte(b) {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
