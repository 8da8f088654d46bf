package hotroute

// tchar marks the bytes of an RFC 9110 token, the syntax of a header
// name.
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return true
}

// isFieldValue reports whether v is a valid header value: no control
// bytes but horizontal tab (bytes from 0x80 up are allowed, as net/http
// allows them).
func isFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// appendFieldValue appends a header value of the answer with any CR or
// LF turned into a space, as net/http does, so that a value cannot end
// the header early.
func appendFieldValue(out []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		out = append(out, c)
	}
	return out
}

// isPlainHost reports whether a Host value is a plain name or address
// with an optional port: letters, digits, '.', '-', '_', ':' and the
// brackets of an IPv6 address. Anything else is left to net/http's own
// check of the Host header.
func isPlainHost(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']') {
			return false
		}
	}
	return true
}
