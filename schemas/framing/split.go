package framing

import (
	"bytes"

	"github.com/sluicehq/sluice/schemas"
)

// SplitJSONArray calls fn with the raw bytes of each element of the JSON
// array in data, in order, with index counting from 0. It finds where each
// element ends (strings, escapes and nesting included) without decoding it,
// so a batch costs one pass for framing plus one decode per element, and a
// broken element can be rejected alone while its neighbours are accepted.
//
// Broken framing (not an array, a missing comma, an unterminated string, an
// unbalanced bracket, data after the closing bracket) returns a
// [*schemas.SyntaxError] with the byte offset in data. Elements before it have
// already been passed to fn, so callers that must be all-or-nothing should
// collect results and act on them only after a nil return. If fn returns an
// error, SplitJSONArray stops and returns that error unchanged.
//
// elem aliases data; fn must not keep it after returning unless data
// outlives it. An empty array calls fn never and returns nil.
func SplitJSONArray(data []byte, fn func(index int, elem []byte) error) error {
	return EachElement(data, func(index, start int) (int, error) {
		end, err := ValueEnd(data, start)
		if err != nil {
			return -1, nil // EachElement frames it again and reports the error
		}
		return end, fn(index, data[start:end])
	})
}

// EachElement walks the JSON array in data for a caller that finds where
// each element ends by itself, typically by decoding it: it calls fn with
// the element's index and start offset, and fn returns the offset just past
// the element, or -1 to leave framing the element to EachElement. When fn
// returns an error, EachElement returns it, unless framing the element
// fails first, in which case it returns that [*schemas.SyntaxError] as
// SplitJSONArray would. Broken framing between elements is reported as in
// SplitJSONArray.
func EachElement(data []byte, fn func(index, start int) (end int, err error)) error {
	d := frame{b: data}
	d.skipWS()
	if d.pos >= len(data) {
		return d.err("empty input; a batch is a JSON array of events")
	}
	if data[d.pos] != '[' {
		return d.err("a batch is a JSON array of events; the input does not start with '['")
	}
	d.pos++
	d.skipWS()
	if d.pos < len(data) && data[d.pos] == ']' {
		d.pos++
		return d.end()
	}
	for index := 0; ; index++ {
		d.skipWS()
		start := d.pos
		if start >= len(data) {
			return d.err("unexpected end of input inside an array element")
		}
		end, err := fn(index, start)
		if end < 0 {
			if ferr := d.value(); ferr != nil {
				return ferr
			}
			end = d.pos
		}
		if err != nil {
			return err
		}
		d.pos = end
		d.skipWS()
		if d.pos >= len(data) {
			return d.err("the array is not closed; add ']'")
		}
		switch data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return d.end()
		default:
			return d.err("expected ',' or ']' after an array element")
		}
	}
}

// ValueEnd returns the offset just past the JSON value that starts at
// start in data, found by tracking strings and bracket nesting without
// decoding anything; scalars are not checked. Broken framing is a
// [*schemas.SyntaxError] with the offset in data.
func ValueEnd(data []byte, start int) (int, error) {
	d := frame{b: data, pos: start}
	if err := d.value(); err != nil {
		return -1, err
	}
	return d.pos, nil
}

// SplitNDJSON calls fn with each line of newline-delimited JSON in data,
// skipping lines that hold only whitespace; index counts the lines passed to
// fn from 0, so that it lines up with per-item results the way
// SplitJSONArray's does. Lines end with "\n" or "\r\n"; the line passed to
// fn has its surrounding whitespace trimmed. NDJSON has no framing beyond
// the newlines, so SplitNDJSON itself never fails: a line that is not one
// JSON value (a pretty-printed object spread over lines, say) fails when it
// is decoded, with an offset relative to the line. If fn returns an error,
// SplitNDJSON stops and returns it unchanged.
//
// line aliases data; see SplitJSONArray.
func SplitNDJSON(data []byte, fn func(index int, line []byte) error) error {
	index := 0
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.Trim(line, " \t\r")
		if len(line) == 0 {
			continue
		}
		if err := fn(index, line); err != nil {
			return err
		}
		index++
	}
	return nil
}

// frame finds the extent of JSON values by tracking strings and bracket
// nesting, without decoding anything.
type frame struct {
	b   []byte
	pos int
}

// err reports broken framing at the cursor.
func (d *frame) err(msg string) *schemas.SyntaxError {
	return &schemas.SyntaxError{Offset: int64(d.pos), Msg: msg}
}

// skipWS skips the four whitespace bytes JSON allows.
func (d *frame) skipWS() {
	for d.pos < len(d.b) {
		switch d.b[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// end checks that only whitespace follows the closing bracket.
func (d *frame) end() error {
	d.skipWS()
	if d.pos != len(d.b) {
		return d.err("unexpected data after the closing ']'")
	}
	return nil
}

// value moves past one value. Brackets must match in kind, which a simple
// depth counter would miss: with "[{]" framing would go astray and merge
// elements. The stack of open brackets lives in a fixed array until the
// nesting gets deeper than any event needs.
func (d *frame) value() error {
	var buf [64]byte
	stack := buf[:0]
	for {
		if d.pos >= len(d.b) {
			return d.err("unexpected end of input inside an array element")
		}
		switch c := d.b[d.pos]; c {
		case '"':
			if err := d.str(); err != nil {
				return err
			}
		case '{', '[':
			stack = append(stack, c)
			d.pos++
		case '}', ']':
			open := byte('{')
			if c == ']' {
				open = '['
			}
			if len(stack) == 0 {
				return d.err("unexpected '" + string(c) + "'; an array element is missing")
			}
			if stack[len(stack)-1] != open {
				return d.err("'" + string(c) + "' does not match the open '" + string(stack[len(stack)-1]) + "'")
			}
			stack = stack[:len(stack)-1]
			d.pos++
		case ',':
			if len(stack) == 0 {
				return d.err("unexpected ','; an array element is missing")
			}
			d.pos++
		case ':':
			if len(stack) == 0 {
				return d.err("unexpected ':'; an array element is missing")
			}
			d.pos++
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			// A scalar: numbers, true, false, null and anything broken run
			// until a delimiter; decoding the element judges them.
			d.pos++
			for d.pos < len(d.b) && !delimiter[d.b[d.pos]] {
				d.pos++
			}
		}
		if len(stack) == 0 {
			return nil
		}
	}
}

// delimiter marks the bytes that end a scalar.
var delimiter = func() (t [256]bool) {
	for _, c := range []byte(" \t\r\n,:[]{}\"") {
		t[c] = true
	}
	return t
}()

// str moves past the string at the cursor. It jumps from quote to quote and
// counts the backslashes before each: an even number means the quote is not
// escaped.
func (d *frame) str() error {
	start := d.pos
	i := start + 1
	for {
		j := bytes.IndexByte(d.b[i:], '"')
		if j < 0 {
			return d.err("string is not terminated; add the closing double quote")
		}
		q := i + j
		n := 0
		for k := q - 1; k > start && d.b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			d.pos = q + 1
			return nil
		}
		i = q + 1
	}
}
