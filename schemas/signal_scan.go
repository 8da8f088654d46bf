package schemas

import (
	"encoding/json"
	"math/bits"

	"github.com/sluicehq/sluice/schemas/internal/jsontext"

	"github.com/sluicehq/sluice/schemas/internal/scalar"
)

// The member walker under DecodeSignal. It checks JSON's grammar (RFC 8259)
// as encoding/json does and hands out each member of one object as its
// key and the text of its value, substrings of the input: a signal then
// costs one copy of its bytes, which its strings share. Values are judged
// by the callers (decodeField and the functions under it), so this file
// knows nothing of signals; signal_json_ref_test.go walks the same members
// with encoding/json's Decoder, and the tests hold the two to the same
// verdicts.

// eachMember checks that data is one JSON object, with nothing but
// whitespace around it, and calls member with the key and the value text of
// each of its members in order; what names the object in syntax errors.
// Like encoding/json's Decoder, it calls member for the members before a
// syntax error, whose work the caller then discards.
//
// A key that has escapes or bytes outside ASCII is decoded by encoding/json,
// so that it reads exactly as it would there (invalid UTF-8 and lone
// surrogates become U+FFFD); other keys are substrings of data.
func eachMember(data, what string, member func(key, raw string)) error {
	w := walker{s: data}
	w.skipWS()
	if w.pos == len(w.s) {
		return w.syntaxError("unexpected end of input; " + what + " is one JSON object")
	}
	if w.s[w.pos] != '{' {
		return w.syntaxError(what + " is a JSON object, but the input starts with " + scalar.Kind(w.s[w.pos]))
	}
	w.pos++
	w.skipWS()
	if w.pos < len(w.s) && w.s[w.pos] == '}' {
		w.pos++
	} else {
		for {
			if w.pos >= len(w.s) || w.s[w.pos] != '"' {
				return w.syntaxError("expected a field name in double quotes")
			}
			kStart := w.pos
			if err := w.skipString(); err != nil {
				return err
			}
			key := w.s[kStart+1 : w.pos-1]
			if w.escaped {
				key = unquote(w.s[kStart:w.pos])
			}
			w.skipWS()
			if w.pos >= len(w.s) || w.s[w.pos] != ':' {
				return w.syntaxError("expected ':' after the field name")
			}
			w.pos++
			w.skipWS()
			vStart := w.pos
			if err := w.skipValue(2); err != nil {
				return err
			}
			member(key, w.s[vStart:w.pos])
			w.skipWS()
			if w.pos >= len(w.s) {
				return w.syntaxError("unexpected end of input; expected ',' or '}' after a field")
			}
			if w.s[w.pos] == '}' {
				w.pos++
				break
			}
			if w.s[w.pos] != ',' {
				return w.syntaxError("expected ',' or '}' after a field")
			}
			w.pos++
			w.skipWS()
		}
	}
	w.skipWS()
	if w.pos != len(w.s) {
		return w.syntaxError("unexpected data after " + what)
	}
	return nil
}

// walker is a cursor over JSON text.
type walker struct {
	s   string
	pos int
	// escaped tells whether the last string skipString passed had an
	// escape or a byte outside ASCII.
	escaped bool
}

func (w *walker) syntaxError(msg string) *SyntaxError {
	return &SyntaxError{Offset: int64(w.pos), Msg: msg}
}

// skipWS skips the four whitespace bytes JSON allows.
func (w *walker) skipWS() { w.pos = jsontext.SkipWS(w.s, w.pos) }

// skipValue checks the value at the cursor and moves past it. depth is the
// nesting of that value (the signal object is 1); past MaxNesting it gives
// up.
func (w *walker) skipValue(depth int) *SyntaxError {
	if w.pos >= len(w.s) {
		return w.syntaxError("unexpected end of input; a value is missing")
	}
	switch c := w.s[w.pos]; c {
	case '"':
		return w.skipString()
	case '{', '[':
		if depth > MaxNesting {
			return w.syntaxError("arrays and objects are nested too deeply")
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		w.pos++
		w.skipWS()
		if w.pos < len(w.s) && w.s[w.pos] == closer {
			w.pos++
			return nil
		}
		for {
			if c == '{' {
				if w.pos >= len(w.s) || w.s[w.pos] != '"' {
					return w.syntaxError("expected a field name in double quotes")
				}
				if err := w.skipString(); err != nil {
					return err
				}
				w.skipWS()
				if w.pos >= len(w.s) || w.s[w.pos] != ':' {
					return w.syntaxError("expected ':' after the field name")
				}
				w.pos++
				w.skipWS()
			}
			if err := w.skipValue(depth + 1); err != nil {
				return err
			}
			w.skipWS()
			if w.pos >= len(w.s) {
				return w.syntaxError("unexpected end of input; expected ',' or '" + string(closer) + "'")
			}
			switch w.s[w.pos] {
			case ',':
				w.pos++
				w.skipWS()
			case closer:
				w.pos++
				return nil
			default:
				return w.syntaxError("expected ',' or '" + string(closer) + "'")
			}
		}
	case 't':
		return w.skipLiteral("true")
	case 'f':
		return w.skipLiteral("false")
	case 'n':
		return w.skipLiteral("null")
	}
	return w.skipNumber()
}

func (w *walker) skipLiteral(lit string) *SyntaxError {
	if len(w.s)-w.pos < len(lit) || w.s[w.pos:w.pos+len(lit)] != lit {
		return w.syntaxError("invalid value; expected a string, number, object, array, true, false or null")
	}
	w.pos += len(lit)
	return nil
}

// skipString checks the string at the cursor's '"' and moves past it.
func (w *walker) skipString() *SyntaxError {
	s := w.s
	i := w.pos + 1
	w.escaped = false
	for {
		// The common case: printable ASCII up to the closing quote, eight
		// bytes at a time while they last.
		for i+8 <= len(s) {
			// A byte outside ASCII stops the run too: the string is then
			// decoded (unquote) rather than sliced.
			word := jsontext.Load64(s, i)
			if m := jsontext.StringStops(word) | word&jsontext.HighBits; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(s) && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' && s[i] < 0x80 {
			i++
		}
		if i >= len(s) {
			return w.syntaxError("string is not terminated; add the closing double quote")
		}
		switch c := s[i]; {
		case c == '"':
			w.pos = i + 1
			return nil
		case c < 0x20:
			w.pos = i
			return w.syntaxError("control character in a string; escape it, for example as \\n or \\u0001")
		case c >= 0x80:
			w.escaped = true
			i++ // any byte: encoding/json accepts invalid UTF-8 here too
		default: // '\\'
			w.escaped = true
			if i+1 >= len(s) {
				return w.syntaxError("string is not terminated; add the closing double quote")
			}
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(s) || !jsontext.IsHex(s[i+2]) || !jsontext.IsHex(s[i+3]) || !jsontext.IsHex(s[i+4]) || !jsontext.IsHex(s[i+5]) {
					w.pos = i
					return w.syntaxError(`invalid \u escape; write four hex digits, like \u00e9`)
				}
				i += 6
			default:
				w.pos = i
				return w.syntaxError(`invalid escape; JSON allows \" \\ \/ \b \f \n \r \t and \uXXXX`)
			}
		}
	}
}

// unquote decodes a string literal that skipString has checked, with
// encoding/json's rules.
func unquote(lit string) string {
	var v string
	if err := json.Unmarshal([]byte(lit), &v); err != nil {
		panic("schemas: a string the walker checked does not decode: " + err.Error())
	}
	return v
}

// skipNumber checks the number at the cursor against JSON's grammar and
// moves past it.
func (w *walker) skipNumber() *SyntaxError {
	if c := w.s[w.pos]; c != '-' && (c < '0' || c > '9') {
		return w.syntaxError("invalid value; expected a string, number, object, array, true, false or null")
	}
	end, problem := jsontext.Number(w.s, w.pos)
	w.pos = end
	if problem != "" {
		return w.syntaxError(problem)
	}
	return nil
}
