package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
)

// request is what the gateway reads from a body before it proxies it:
// the few top-level members routing and metering need. The rest is
// skipped, not decoded: the provider validates the body, the estimator
// counts its prompt.
type request struct {
	Model  string
	Stream bool
	// IncludeUsage is stream_options.include_usage.
	IncludeUsage bool
	// User is the body's "user" (OpenAI's end-user id), if a string.
	User string
	// soStart and soEnd are the byte range of stream_options' value, or -1.
	soStart, soEnd int
	// modelStart and modelEnd are the byte range of model's value.
	modelStart, modelEnd int
}

var errNotObject = errors.New("the body must be a JSON object")

// maxScanDepth bounds the nesting the scanner follows.
const maxScanDepth = 128

// scanRequest reads body's top-level members. It checks the JSON only as
// far as it must to find their ends, and never panics on any input.
func scanRequest(body []byte) (request, error) {
	req := request{soStart: -1, soEnd: -1}
	i := ws(body, 0)
	if i >= len(body) || body[i] != '{' {
		return req, errNotObject
	}
	i = ws(body, i+1)
	if i < len(body) && body[i] == '}' {
		return req, nil
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return req, fmt.Errorf("invalid JSON at byte %d: want a member name", i)
		}
		kEnd, err := skipString(body, i)
		if err != nil {
			return req, err
		}
		key := body[i+1 : kEnd-1]
		i = ws(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return req, fmt.Errorf("invalid JSON at byte %d: want ':'", i)
		}
		vStart := ws(body, i+1)
		vEnd, err := skipValue(body, vStart, 0)
		if err != nil {
			return req, err
		}
		val := body[vStart:vEnd]
		switch string(key) {
		case "model":
			if err := json.Unmarshal(val, &req.Model); err != nil {
				return req, fmt.Errorf("model: must be a string")
			}
			req.modelStart, req.modelEnd = vStart, vEnd
		case "stream":
			req.Stream = string(val) == "true"
		case "user":
			_ = json.Unmarshal(val, &req.User) // not a string: ignored, the provider answers it
		case "stream_options":
			req.soStart, req.soEnd = vStart, vEnd
			var so struct {
				IncludeUsage bool `json:"include_usage"`
			}
			if json.Unmarshal(val, &so) == nil {
				req.IncludeUsage = so.IncludeUsage
			}
		}
		i = ws(body, vEnd)
		if i < len(body) && body[i] == ',' {
			i = ws(body, i+1)
			continue
		}
		if i < len(body) && body[i] == '}' {
			if ws(body, i+1) != len(body) {
				return req, fmt.Errorf("invalid JSON at byte %d: data after the object", i+1)
			}
			return req, nil
		}
		return req, fmt.Errorf("invalid JSON at byte %d: want ',' or '}'", i)
	}
}

// withModel returns body asking for model instead of the one it names
// (a fallback), the rest unchanged; req is body's scan.
func withModel(body []byte, req request, model string) []byte {
	val, _ := json.Marshal(model)
	out := make([]byte, 0, len(body)+len(val))
	out = append(out, body[:req.modelStart]...)
	out = append(out, val...)
	return append(out, body[req.modelEnd:]...)
}

// withIncludeUsage returns body asking for the usage chunk at the end of
// its stream: stream_options.include_usage true, the rest unchanged.
func withIncludeUsage(body []byte, req request) []byte {
	if req.soStart < 0 {
		// Insert the member first: no existing member is touched.
		i := ws(body, 0) + 1
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:i]...)
		out = append(out, `"stream_options":{"include_usage":true}`...)
		if ws(body, i) < len(body) && body[ws(body, i)] != '}' {
			out = append(out, ',')
		}
		return append(out, body[i:]...)
	}
	var so map[string]json.RawMessage
	if json.Unmarshal(body[req.soStart:req.soEnd], &so) != nil || so == nil {
		so = map[string]json.RawMessage{}
	}
	so["include_usage"] = json.RawMessage("true")
	val, _ := json.Marshal(so)
	out := make([]byte, 0, len(body)+len(val))
	out = append(out, body[:req.soStart]...)
	out = append(out, val...)
	return append(out, body[req.soEnd:]...)
}

func ws(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("invalid JSON: unterminated string at byte %d", i)
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, errors.New("invalid JSON: unexpected end")
	}
	switch c := b[i]; c {
	case '"':
		return skipString(b, i)
	case '{', '[':
		if depth >= maxScanDepth {
			return 0, fmt.Errorf("invalid JSON: nested deeper than %d", maxScanDepth)
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		j := ws(b, i+1)
		if j < len(b) && b[j] == closer {
			return j + 1, nil
		}
		for {
			if c == '{' {
				if j >= len(b) || b[j] != '"' {
					return 0, fmt.Errorf("invalid JSON at byte %d: want a member name", j)
				}
				k, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = ws(b, k)
				if j >= len(b) || b[j] != ':' {
					return 0, fmt.Errorf("invalid JSON at byte %d: want ':'", j)
				}
				j = ws(b, j+1)
			}
			end, err := skipValue(b, j, depth+1)
			if err != nil {
				return 0, err
			}
			j = ws(b, end)
			if j < len(b) && b[j] == ',' {
				j = ws(b, j+1)
				continue
			}
			if j < len(b) && b[j] == closer {
				return j + 1, nil
			}
			return 0, fmt.Errorf("invalid JSON at byte %d: want ',' or '%c'", j, closer)
		}
	default:
		// A number or a literal: up to the next delimiter.
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				if j == i {
					return 0, fmt.Errorf("invalid JSON at byte %d", i)
				}
				return j, nil
			}
			j++
		}
		if j == i {
			return 0, fmt.Errorf("invalid JSON at byte %d", i)
		}
		return j, nil
	}
}
