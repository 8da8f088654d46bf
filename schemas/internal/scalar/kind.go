package scalar

// Kind names the JSON type of the value that starts with byte c, for
// problems such as "must be a string, not a number". c is the first byte of
// a well-formed value, or 0 at the end of input.
func Kind(c byte) string {
	switch c {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
