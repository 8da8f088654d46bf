package schemas

import (
	"strconv"
	"strings"
)

// FieldError is one problem with one field of an event or a signal.
type FieldError struct {
	// Field is the JSON path of the offending field: a top-level name such as
	// "prompt_tokens", "attributes.team" for an attribute, or "data.tenant"
	// for the payload of a CloudEvent.
	Field string
	// Reason says what is wrong, including the limit that was crossed, and
	// what to send instead.
	Reason string
}

// Error returns "field: reason".
func (e FieldError) Error() string {
	return e.Field + ": " + e.Reason
}

// ValidationError lists every problem found in one event or signal, so that
// a gateway developer can fix them all after one round trip instead of one
// per attempt. It is never empty when returned as an error.
type ValidationError []FieldError

// Error returns all problems on one line, separated by semicolons.
func (e ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("schemas: ")
	if len(e) == 1 {
		b.WriteString("invalid field ")
	} else {
		b.WriteString(strconv.Itoa(len(e)))
		b.WriteString(" invalid fields: ")
	}
	for i, fe := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(fe.Field)
		b.WriteString(": ")
		b.WriteString(fe.Reason)
	}
	return b.String()
}

// Has reports whether e names field, which is convenient in tests and in
// code that maps problems to responses.
func (e ValidationError) Has(field string) bool {
	for _, fe := range e {
		if fe.Field == field {
			return true
		}
	}
	return false
}

// Add appends a problem with the field at path prefix+field, for decoders
// that collect problems while they read ("data." is the prefix inside a
// CloudEvent). Callers are on the error path only, so the concatenation
// costs nothing when input is valid.
//
// Past MaxProblemsPerEvent problems it adds one last entry saying more were
// left out, then nothing: a hostile event cannot make its error grow with
// its size.
func (e *ValidationError) Add(prefix, field, reason string) {
	switch n := len(*e); {
	case n < MaxProblemsPerEvent:
		*e = append(*e, FieldError{Field: prefix + field, Reason: reason})
	case n == MaxProblemsPerEvent:
		*e = append(*e, FieldError{Field: prefix + field, Reason: TruncatedProblems})
	}
}

// TruncatedProblems is the reason of the entry that ends a ValidationError
// cut at MaxProblemsPerEvent.
const TruncatedProblems = "and more problems, not listed (at most MaxProblemsPerEvent = 20 are); fix these and send again"

// Err returns e as an error, or a nil error (not a typed nil, which would
// compare unequal to nil) when e is empty.
func (e ValidationError) Err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}

// SyntaxError reports input that is not well-formed JSON, or whose framing
// (an array of events, NDJSON) is broken, at a point after which nothing
// further can be checked.
type SyntaxError struct {
	// Offset is the byte offset in the input at which the problem was found.
	Offset int64
	// Msg describes the problem.
	Msg string
}

// Error returns the message with its byte offset.
func (e *SyntaxError) Error() string {
	return "schemas: JSON syntax error at byte " + strconv.FormatInt(e.Offset, 10) + ": " + e.Msg
}

// FieldPath returns an object key as an element of [FieldError].Field. An
// empty key would make the path end in a bare dot or vanish, so it is
// written as "".
func FieldPath(key string) string {
	if key == "" {
		return `""`
	}
	return key
}
