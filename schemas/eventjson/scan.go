package eventjson

import (
	"math/bits"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sluicehq/sluice/schemas/internal/jsontext"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// scanner is the lexer under the hand-written decoders. It works on a string
// so that unescaped string values can be returned as substrings of one copy
// of the input: decoding an event then costs one allocation for the copy, and
// the event's strings share it.
type scanner struct {
	s   string
	pos int
	// ascii tells whether the last string readString returned was plain
	// ASCII.
	ascii bool
	// maps, when not nil, holds emptied attribute maps to fill before
	// making new ones; see BatchDecoder.
	maps *[]map[string]string
	// verified collects the fields of a usage event that decoding has
	// already checked against every rule, so validation skips them.
	verified schemas.EventField
}

func (d *scanner) syntaxError(msg string) *schemas.SyntaxError {
	return &schemas.SyntaxError{Offset: int64(d.pos), Msg: msg}
}

// skipWS skips the four whitespace bytes JSON allows.
func (d *scanner) skipWS() { d.pos = jsontext.SkipWS(d.s, d.pos) }

// startObject skips whitespace up to the object a whole input must be;
// what names the object and send says what to send instead of nothing.
func (d *scanner) startObject(what, send string) *schemas.SyntaxError {
	d.skipWS()
	if d.pos == len(d.s) {
		return d.syntaxError("empty input; send " + send)
	}
	if d.peek() != '{' {
		return d.syntaxError(what + " is a JSON object, but the input starts with " + scalar.Kind(d.peek()))
	}
	return nil
}

// peek returns the byte at the cursor, or 0 at the end of input.
func (d *scanner) peek() byte {
	if d.pos < len(d.s) {
		return d.s[d.pos]
	}
	return 0
}

// strSpecial marks the bytes that end the fast path of a string: the closing
// quote, a backslash, and the control characters JSON forbids unescaped.
var strSpecial = func() (t [256]bool) {
	for i := 0; i < 0x20; i++ {
		t[i] = true
	}
	t['"'] = true
	t['\\'] = true
	return t
}()

// readString reads the string starting at the cursor's '"'. It returns the
// value, and in bad a reason when the string is well-formed JSON but not
// valid Unicode (a lone UTF-16 surrogate escape), which the caller reports as
// a problem of the field rather than as a syntax error. It sets d.ascii to
// whether the value is plain ASCII, which spares validation a UTF-8 pass.
//
// Strings are most of an event's bytes, so the fast path looks at eight
// bytes at a time (SWAR): one word tells whether any of them ends the fast
// path, and the lowest such byte is found with a trailing-zero count.
func (d *scanner) readString() (val, bad string, err *schemas.SyntaxError) {
	s := d.s
	start := d.pos + 1
	i := start
	var seen uint64 // OR of the value's bytes: its high bits tell non-ASCII
	for {
		if i+8 > len(s) {
			for i < len(s) && !strSpecial[s[i]] {
				seen |= uint64(s[i])
				i++
			}
			break
		}
		w := jsontext.Load64(s, i)
		if m := jsontext.StringStops(w); m != 0 {
			k := uint(bits.TrailingZeros64(m)) &^ 7 // bit offset of the stop byte
			seen |= w & (1<<k - 1)
			i += int(k >> 3)
			break
		}
		seen |= w
		i += 8
	}
	if i < len(s) && s[i] == '"' {
		d.pos = i + 1
		d.ascii = seen&jsontext.HighBits == 0
		return s[start:i], "", nil
	}
	d.ascii = false
	return d.readEscaped(start, i)
}

// readEscaped finishes a string that contains escapes (or is broken), from
// the first special byte at i on. Escaped strings are rare in events, so
// this path may allocate.
func (d *scanner) readEscaped(start, i int) (val, bad string, err *schemas.SyntaxError) {
	// Find the end first so that the builder is sized once: the unescaped
	// value is never longer than its escaped form.
	end := i
	for {
		for end < len(d.s) && !strSpecial[d.s[end]] {
			end++
		}
		if end >= len(d.s) {
			d.pos = start - 1
			return "", "", d.syntaxError("string is not terminated; add the closing double quote")
		}
		c := d.s[end]
		if c == '"' {
			break
		}
		if c < 0x20 {
			d.pos = end
			return "", "", d.syntaxError("control character in a string; escape it, for example as \\n or \\u0001")
		}
		end += 2 // a backslash and the byte it escapes, which may be '"'
	}
	var b strings.Builder
	b.Grow(end - start)
	b.WriteString(d.s[start:i])
	for i < end {
		c := d.s[i]
		if c != '\\' {
			j := i + 1
			for j < end && d.s[j] != '\\' {
				j++
			}
			b.WriteString(d.s[i:j])
			i = j
			continue
		}
		if i+1 >= end {
			d.pos = i
			return "", "", d.syntaxError("string is not terminated; add the closing double quote")
		}
		switch d.s[i+1] {
		case '"', '\\', '/':
			b.WriteByte(d.s[i+1])
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := hex4(d.s, i+2, end)
			if !ok {
				d.pos = i
				return "", "", d.syntaxError(`invalid \u escape; write four hex digits, like \u00e9`)
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok2 := rune(0), false
				if r < 0xDC00 && i+1 < end && d.s[i] == '\\' && d.s[i+1] == 'u' {
					r2, ok2 = hex4(d.s, i+2, end)
				}
				if ok2 {
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						b.WriteRune(dec)
						i += 6
						continue
					}
				}
				bad = scalar.LoneSurrogateReason
				r = utf8.RuneError
			}
			b.WriteRune(r)
			continue
		default:
			d.pos = i
			return "", "", d.syntaxError(`invalid escape; JSON allows \" \\ \/ \b \f \n \r \t and \uXXXX`)
		}
		i += 2
	}
	d.pos = end + 1
	return b.String(), bad, nil
}

// hex4 parses the four hex digits at s[i:i+4], which must end before end.
func hex4(s string, i, end int) (rune, bool) {
	if i+4 > end {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// readNumber reads the number at the cursor, checks it against JSON's
// grammar and returns its text.
func (d *scanner) readNumber() (string, *schemas.SyntaxError) {
	start := d.pos
	end, problem := jsontext.Number(d.s, start)
	d.pos = end
	if problem != "" {
		return "", d.syntaxError(problem)
	}
	return d.s[start:end], nil
}

// readLiteral reads true, false or null at the cursor and returns its first
// byte.
func (d *scanner) readLiteral() (byte, *schemas.SyntaxError) {
	rest := d.s[d.pos:]
	for _, lit := range [...]string{"true", "false", "null"} {
		if strings.HasPrefix(rest, lit) {
			d.pos += len(lit)
			return lit[0], nil
		}
	}
	return 0, d.syntaxError("invalid value; expected a string, number, object, array, true, false or null")
}

// skipValue reads and discards the value at the cursor, checking its syntax.
func (d *scanner) skipValue(depth int) *schemas.SyntaxError {
	switch c := d.peek(); c {
	case '"':
		_, _, err := d.readString()
		return err
	case '{', '[':
		if depth >= schemas.MaxNesting {
			return d.syntaxError("arrays and objects are nested too deeply")
		}
		d.pos++
		d.skipWS()
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		if d.peek() == closer {
			d.pos++
			return nil
		}
		for {
			d.skipWS()
			if c == '{' {
				if d.peek() != '"' {
					return d.syntaxError("expected a field name in double quotes")
				}
				if _, _, err := d.readString(); err != nil {
					return err
				}
				d.skipWS()
				if d.peek() != ':' {
					return d.syntaxError("expected ':' after the field name")
				}
				d.pos++
				d.skipWS()
			}
			if err := d.skipValue(depth + 1); err != nil {
				return err
			}
			d.skipWS()
			switch d.peek() {
			case ',':
				d.pos++
			case closer:
				d.pos++
				return nil
			default:
				return d.syntaxError("expected ',' or '" + string(closer) + "'")
			}
		}
	case 't', 'f', 'n':
		_, err := d.readLiteral()
		return err
	case 0:
		if d.pos >= len(d.s) {
			return d.syntaxError("unexpected end of input; a value is missing")
		}
	}
	_, err := d.readNumber()
	return err
}

// readKey reads an object key and the colon after it; the cursor must be on
// the key's opening quote or on something that should have been one.
func (d *scanner) readKey() (string, *schemas.SyntaxError) {
	if d.peek() != '"' {
		return "", d.syntaxError("expected a field name in double quotes")
	}
	key, _, err := d.readString()
	if err != nil {
		return "", err
	}
	d.skipWS()
	if d.peek() != ':' {
		return "", d.syntaxError("expected ':' after the field name")
	}
	d.pos++
	d.skipWS()
	return key, nil
}

// next consumes the ',' or '}' after an object member and reports whether
// the object ended.
func (d *scanner) next() (done bool, err *schemas.SyntaxError) {
	d.skipWS()
	switch d.peek() {
	case ',':
		d.pos++
		d.skipWS()
		return false, nil
	case '}':
		d.pos++
		return true, nil
	}
	return false, d.syntaxError("expected ',' or '}' after a field")
}
