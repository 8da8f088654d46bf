package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
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
//
// What the gateway decides on must be what the provider reads, and
// providers' decoders disagree on the edges of JSON: all of them decode
// escapes in member names (`"mod\u0065l"` is "model"), Python's keep the
// last of two members of one name, Go's also match names ignoring case
// ("Model", or "MAX_TOKENS", is max_tokens). So scanRequest decodes
// names, and refuses a body that names a top-level member twice (compared
// ignoring case) or spells one the gateway or the estimator reads in
// another case: such a body would be authorised, routed or estimated as
// one request and served as another.
func scanRequest(body []byte) (request, error) {
	req := request{soStart: -1, soEnd: -1}
	var names memberNames
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
		key, err := memberName(body[i:kEnd])
		if err != nil {
			return req, err
		}
		if err := names.add(key); err != nil {
			return req, err
		}
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
			// Only a JSON boolean: a lax provider reads "true" or 1 as a
			// stream, which the gateway would then relay as a plain answer.
			if v := string(val); v != "true" && v != "false" && v != "null" {
				return req, errors.New("stream: must be true or false")
			}
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
// (a fallback, an Azure deployment), the rest unchanged; req is body's
// scan.
func withModel(body []byte, req request, model string) []byte {
	val, _ := json.Marshal(model)
	if req.modelEnd == 0 {
		// The body names no model (an Azure client's, whose URL names the
		// deployment): the member is inserted first.
		i := ws(body, 0) + 1
		out := make([]byte, 0, len(body)+len(val)+10)
		out = append(append(append(out, body[:i]...), `"model":`...), val...)
		if ws(body, i) < len(body) && body[ws(body, i)] != '}' {
			out = append(out, ',')
		}
		return append(out, body[i:]...)
	}
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

// memberName is the decoded name of the member whose quoted name is
// quoted (escapes are rare: only then is anything allocated).
func memberName(quoted []byte) ([]byte, error) {
	name := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(name, '\\') < 0 {
		return name, nil
	}
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return nil, fmt.Errorf("invalid JSON: member name %s: %v", quoted, err)
	}
	return []byte(s), nil
}

// readMembers are the top-level members the gateway or the estimator
// (sdk/go/estimate) read: a body may not spell them in another case.
var readMembers = []string{"model", "stream", "stream_options", "user", "max_tokens", "max_completion_tokens", "max_output_tokens",
	"n", "best_of", "messages", "tools", "functions", "prompt", "suffix", "input", "instructions",
	// Gemini's, in both of the spellings its API reads.
	"contents", "systemInstruction", "system_instruction", "generationConfig", "generation_config"}

// memberNames are the top-level member names of a body seen so far.
type memberNames struct {
	list [][]byte            // while few: compared pairwise
	set  map[string]struct{} // beyond maxListedNames: folded names
}

// maxListedNames bounds the pairwise comparisons: a body of many members
// costs a map, not a quadratic scan.
const maxListedNames = 32

// add records name, or refuses it as a duplicate or a miscased member the
// gateway reads.
func (m *memberNames) add(name []byte) error {
	for _, r := range readMembers {
		if len(name) >= len(r) && bytes.EqualFold(name, []byte(r)) && string(name) != r {
			return fmt.Errorf("member %q is %q spelt in another case; providers disagree on whether they are one member, so send %q", name, r, r)
		}
	}
	if m.set == nil && len(m.list) < maxListedNames {
		for _, seen := range m.list {
			if bytes.EqualFold(seen, name) {
				return duplicateMember(name)
			}
		}
		m.list = append(m.list, name)
		return nil
	}
	if m.set == nil {
		m.set = make(map[string]struct{}, 2*maxListedNames)
		for _, seen := range m.list {
			m.set[foldName(seen)] = struct{}{}
		}
	}
	f := foldName(name)
	if _, dup := m.set[f]; dup {
		return duplicateMember(name)
	}
	m.set[f] = struct{}{}
	return nil
}

func duplicateMember(name []byte) error {
	return fmt.Errorf("member %q appears twice (names compared after decoding escapes, ignoring case); providers disagree on which one counts, so send each member once", name)
}

// foldName maps name to one spelling per case-insensitive class, as
// bytes.EqualFold compares: each rune becomes the least of its Unicode
// simple-folding orbit (so "K", "k" and the Kelvin sign all map to "K").
func foldName(name []byte) string {
	out := make([]rune, 0, len(name))
	for _, r := range string(name) {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		out = append(out, least)
	}
	return string(out)
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
