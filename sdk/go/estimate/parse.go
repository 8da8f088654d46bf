package estimate

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Endpoint is the OpenAI operation a request body is for; each keeps its
// prompt in other fields.
type Endpoint uint8

// The endpoints Parse understands.
const (
	// ChatCompletions is POST /v1/chat/completions: messages (text or
	// content parts), tools and functions.
	ChatCompletions Endpoint = iota + 1
	// Completions is POST /v1/completions: prompt (a string, strings,
	// token ids or arrays of token ids) and suffix.
	Completions
	// Embeddings is POST /v1/embeddings: input, in the same shapes as a
	// completions prompt. It has no completion.
	Embeddings
	// Responses is POST /v1/responses: input (a string or items),
	// instructions and tools.
	Responses
	// AnthropicMessages is Anthropic's POST /v1/messages: messages (text
	// or content blocks), system (a string or blocks) and tools, with
	// max_tokens; an image or document block counts as ImageTokens.
	AnthropicMessages
	// GeminiGenerateContent is Gemini's POST
	// /v1beta/models/{model}:generateContent and :streamGenerateContent:
	// contents (each a content's parts), systemInstruction and tools, with
	// generationConfig.maxOutputTokens and candidateCount; the model is in
	// the path, not the body. An inlineData or fileData part counts as
	// ImageTokens.
	GeminiGenerateContent
)

// String returns the endpoint's path.
func (e Endpoint) String() string {
	switch e {
	case ChatCompletions:
		return "/v1/chat/completions"
	case Completions:
		return "/v1/completions"
	case Embeddings:
		return "/v1/embeddings"
	case Responses:
		return "/v1/responses"
	case AnthropicMessages:
		return "/v1/messages"
	case GeminiGenerateContent:
		return "/v1/models/{model}:generateContent" // both methods, either version
	}
	return "unknown"
}

// EndpointOf returns the endpoint a request path names, by its last
// segments, so that prefixes ("/openai/v1/…", Azure's deployments paths)
// do not matter; ok is false for any other operation.
func EndpointOf(path string) (e Endpoint, ok bool) {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return ChatCompletions, true
	case strings.HasSuffix(path, "/completions"):
		return Completions, true
	case strings.HasSuffix(path, "/embeddings"):
		return Embeddings, true
	case strings.HasSuffix(path, "/responses"):
		return Responses, true
	case strings.HasSuffix(path, "/messages"):
		return AnthropicMessages, true
	case strings.HasSuffix(path, ":generateContent"), strings.HasSuffix(path, ":streamGenerateContent"):
		return GeminiGenerateContent, true
	}
	return 0, false
}

// Limits bound what Parse reads.
type Limits struct {
	// MaxBodyBytes is the largest body Parse accepts (ErrBodyTooLarge
	// beyond it).
	MaxBodyBytes int
	// MaxDepth is the deepest nesting of arrays and objects Parse follows;
	// deeper bodies are refused rather than risk the stack.
	MaxDepth int
	// ImageTokens is what one image part counts for. The real cost
	// depends on the image's size and detail, which Parse does not decode.
	ImageTokens int64
}

// Defaults for Limits.
const (
	DefaultMaxBodyBytes = 4 << 20
	DefaultMaxDepth     = 64
	// DefaultImageTokens is what a 1024×1024 image costs gpt-4o at high
	// detail (85 + 4 tiles × 170), a middle guess for images whose size is
	// unknown: low detail costs 85, a large image more.
	DefaultImageTokens = 765
	// MaxChoices bounds n and best_of, as OpenAI does (n ≤ 128).
	MaxChoices = 128
	// perMessage and replyPriming are the tokens OpenAI's chat format adds
	// around each message and before the reply.
	perMessage   = 3
	replyPriming = 3
)

// DefaultLimits returns the default Limits.
func DefaultLimits() Limits {
	return Limits{MaxBodyBytes: DefaultMaxBodyBytes, MaxDepth: DefaultMaxDepth, ImageTokens: DefaultImageTokens}
}

// ErrBodyTooLarge is returned (wrapped, naming the limit) for a body
// longer than Limits.MaxBodyBytes.
var ErrBodyTooLarge = errors.New("estimate: request body too large")

// Request is what Parse reads from a body.
type Request struct {
	// Endpoint is the operation the body was parsed for.
	Endpoint Endpoint
	// Model is the body's model ("" if it has none).
	Model string
	// Family is Model's family.
	Family Family
	// PromptTokens is the estimated prompt size: the text of the prompt
	// fields counted with Family's weights, token-id arrays counted
	// exactly, plus OpenAI's per-message overhead and ImageTokens per image.
	PromptTokens int64
	// MaxOutputTokens is max_completion_tokens, max_tokens or
	// max_output_tokens, whichever the body gives (the first two: the
	// larger); 0 when none is given.
	MaxOutputTokens int64
	// Choices is n (and best_of for completions, whichever is larger),
	// 1 to MaxChoices; 1 when not given.
	Choices int64
	// Stream is the body's stream flag.
	Stream bool
	// Images is the number of image parts counted.
	Images int
}

// Parse reads an OpenAI request body for ep in one pass, without
// reflection and allocating only the model name: it follows the prompt
// fields of ep and skips everything else. It checks the JSON as far as it
// reads it and refuses bodies beyond lim; the error names the byte offset
// or the limit.
func Parse(ep Endpoint, body []byte, lim Limits) (Request, error) {
	if lim.MaxBodyBytes > 0 && len(body) > lim.MaxBodyBytes {
		return Request{}, fmt.Errorf("%w: %d bytes, max_body_bytes is %d", ErrBodyTooLarge, len(body), lim.MaxBodyBytes)
	}
	if lim.MaxDepth <= 0 {
		lim.MaxDepth = DefaultMaxDepth
	}
	p := parser{buf: body, lim: lim, ep: ep}
	req, err := p.top()
	if err != nil {
		return Request{}, err
	}
	return req, nil
}

// parser walks one body. Its methods return an error only for malformed
// JSON or a limit; they never panic on any input (FuzzParse).
type parser struct {
	buf    []byte
	pos    int
	depth  int
	lim    Limits
	ep     Endpoint
	c      counter
	images int
	// keyBuf holds the last key read with escapes, decoded.
	keyBuf []byte
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("estimate: invalid JSON at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) ws() {
	for p.pos < len(p.buf) {
		switch p.buf[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (p *parser) peek() byte {
	p.ws()
	if p.pos >= len(p.buf) {
		return 0
	}
	return p.buf[p.pos]
}

func (p *parser) expect(b byte) error {
	if p.peek() != b {
		if p.pos >= len(p.buf) {
			return p.errorf("unexpected end, want %q", b)
		}
		return p.errorf("found %q, want %q", p.buf[p.pos], b)
	}
	p.pos++
	return nil
}

func (p *parser) top() (Request, error) {
	req := Request{Endpoint: p.ep, Choices: 1}
	var maxTokens, maxCompletion, maxOutput, n, bestOf int64
	for first := true; ; first = false {
		key, more, err := p.member(first)
		if err != nil {
			return req, err
		}
		if !more {
			break
		}
		switch string(key) { // compiles to comparisons, no allocation
		case "model":
			req.Model, err = p.stringValue()
		case "stream":
			req.Stream, err = p.boolValue()
		// A member named twice is counted at its largest: providers keep
		// the last, and the estimate must not be the smaller of the two.
		case "max_tokens":
			maxTokens, err = p.maxInt(maxTokens)
		case "max_completion_tokens":
			maxCompletion, err = p.maxInt(maxCompletion)
		case "max_output_tokens":
			maxOutput, err = p.maxInt(maxOutput)
		case "n":
			n, err = p.maxInt(n)
		case "best_of":
			if p.ep == Completions {
				bestOf, err = p.maxInt(bestOf)
			} else {
				err = p.skip()
			}
		case "messages":
			if p.ep == ChatCompletions || p.ep == AnthropicMessages {
				err = p.items()
				p.c.f.exact += replyPriming
			} else {
				err = p.skip()
			}
		case "tools", "functions":
			if p.ep != Completions && p.ep != Embeddings {
				err = p.schema()
			} else {
				err = p.skip()
			}
		case "prompt", "suffix":
			if p.ep == Completions {
				err = p.prompt(0)
			} else {
				err = p.skip()
			}
		case "input":
			switch p.ep {
			case Embeddings:
				err = p.prompt(0)
			case Responses:
				if p.peek() == '[' {
					err = p.items()
				} else {
					err = p.text()
				}
			default:
				err = p.skip()
			}
		case "instructions":
			if p.ep == Responses {
				err = p.text()
			} else {
				err = p.skip()
			}
		case "system":
			if p.ep == AnthropicMessages {
				err = p.content()
			} else {
				err = p.skip()
			}
		case "contents", "systemInstruction", "system_instruction", "generationConfig", "generation_config":
			maxOutput, n, err = p.geminiMember(key, maxOutput, n)
		default:
			err = p.skip()
		}
		if err != nil {
			return req, err
		}
	}
	if p.peek() != 0 {
		return req, p.errorf("data after the top-level object")
	}
	req.Family = FamilyOf(req.Model)
	req.PromptTokens = p.c.f.tokens(req.Family) + int64(p.images)*p.lim.ImageTokens
	req.Images = p.images
	req.MaxOutputTokens = max(maxTokens, maxCompletion, maxOutput)
	req.Choices = min(max(1, n, bestOf), MaxChoices)
	if p.ep == Embeddings {
		req.MaxOutputTokens, req.Choices = 0, 1
	}
	return req, nil
}

// geminiMember reads a top-level member of a Gemini request (skipped on
// other endpoints): the contents, the system instruction, or the output
// bounds in generationConfig, given their values so far. Gemini's JSON
// takes each name in lowerCamelCase or as the proto's snake_case; both
// are read.
func (p *parser) geminiMember(key []byte, maxOutput, n int64) (int64, int64, error) {
	if p.ep != GeminiGenerateContent {
		return maxOutput, n, p.skip()
	}
	switch string(key) {
	case "contents":
		p.c.f.exact += replyPriming
		return maxOutput, n, p.items()
	case "generationConfig", "generation_config":
		return p.generationConfig(maxOutput, n)
	}
	return maxOutput, n, p.content() // systemInstruction
}

// generationConfig reads Gemini's generationConfig: maxOutputTokens and
// candidateCount (either spelling, each at its largest when named twice),
// given their values so far; the rest is skipped.
func (p *parser) generationConfig(maxOutput, n int64) (int64, int64, error) {
	if p.peek() != '{' {
		return maxOutput, n, p.skip() // not an object: the upstream will refuse it
	}
	for first := true; ; first = false {
		key, more, err := p.member(first) // the first opens the object
		if err != nil || !more {
			return maxOutput, n, err
		}
		switch string(key) {
		case "maxOutputTokens", "max_output_tokens":
			maxOutput, err = p.maxInt(maxOutput)
		case "candidateCount", "candidate_count":
			n, err = p.maxInt(n)
		default:
			err = p.skip()
		}
		if err != nil {
			return maxOutput, n, err
		}
	}
}

// enter goes one level deeper into arrays and objects.
func (p *parser) enter() error {
	if p.depth++; p.depth > p.lim.MaxDepth {
		return fmt.Errorf("estimate: body nests deeper than %d levels (max_depth)", p.lim.MaxDepth)
	}
	return nil
}

// open consumes the '{' or '[' that begins a value and enters its level.
func (p *parser) open(b byte) error {
	if err := p.expect(b); err != nil {
		return err
	}
	return p.enter()
}

// member moves to the next member of the object at hand: first past its
// '{' (entering its level), then past each ','. It returns the key (valid
// until the next read) positioned at the value, or more false after the
// closing '}', which also leaves the level entered for the object.
func (p *parser) member(first bool) (key []byte, more bool, err error) {
	if first {
		if err := p.open('{'); err != nil {
			return nil, false, err
		}
	}
	switch p.peek() {
	case '}':
		p.pos++
		p.depth--
		return nil, false, nil
	case ',':
		if first {
			return nil, false, p.errorf("',' before the first member")
		}
		p.pos++
	default:
		if !first {
			return nil, false, p.errorf("want ',' or '}' in an object")
		}
	}
	if key, err = p.key(); err != nil {
		return nil, false, err
	}
	return key, true, p.expect(':')
}

// element moves to the next element of the array at hand: first past its
// '[' (entering its level), then past each ','; it returns more false
// after the closing ']' (leaving the level).
func (p *parser) element(first bool) (more bool, err error) {
	if first {
		if err := p.open('['); err != nil {
			return false, err
		}
	}
	switch p.peek() {
	case ']':
		p.pos++
		p.depth--
		return false, nil
	case ',':
		if first {
			return false, p.errorf("',' before the first element")
		}
		p.pos++
	case 0:
		return false, p.errorf("unexpected end in an array")
	default:
		if !first {
			return false, p.errorf("want ',' or ']' in an array")
		}
	}
	return true, nil
}

// key reads an object key, decoded: a provider reads `"m\u0065ssages"`
// as messages, so the estimate must too, or a body could spell its
// prompt so that it is not counted.
func (p *parser) key() ([]byte, error) {
	if err := p.expect('"'); err != nil {
		return nil, err
	}
	start := p.pos
	if err := p.skipString(); err != nil {
		return nil, err
	}
	raw := p.buf[start : p.pos-1]
	if !containsByte(raw, '\\') {
		return raw, nil
	}
	p.keyBuf = p.keyBuf[:0]
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			p.keyBuf = append(p.keyBuf, raw[i])
			i++
			continue
		}
		r, n, err := p.escape(start + i)
		if err != nil {
			return nil, err
		}
		p.keyBuf = utf8.AppendRune(p.keyBuf, r)
		i += n
	}
	return p.keyBuf, nil
}

// items counts an array of chat messages or Responses input items: each
// costs OpenAI's per-message overhead plus its text.
func (p *parser) items() error {
	if p.peek() != '[' {
		return p.skip() // not an array: the upstream will refuse it
	}
	for first := true; ; first = false {
		if more, err := p.element(first); err != nil || !more {
			return err
		}
		p.c.f.exact += perMessage
		if err := p.content(); err != nil {
			return err
		}
	}
}

// content counts the text in a message, content part or item: every
// string, except the values of structural keys (ids, types, URLs) and of
// media, which count as ImageTokens per image and nothing otherwise.
func (p *parser) content() error { return p.walk(contentText) }

// schema counts tool and function definitions: keys and strings, since
// OpenAI renders the JSON schema into the prompt with its names.
func (p *parser) schema() error { return p.walk(schemaText) }

// walkMode says what walk counts of a value: a message's content, a
// tool's schema, or nothing (the value is only moved past). A mode rather
// than a callback keeps the walk free of allocations.
type walkMode uint8

const (
	contentText walkMode = iota
	schemaText
	skipValue
)

// walk counts one JSON value: strings through text, arrays element by
// element, objects member by member as mode says; anything else is
// skipped.
func (p *parser) walk(mode walkMode) error {
	switch p.peek() {
	case '"':
		if mode == skipValue {
			p.pos++
			return p.skipString()
		}
		return p.text()
	case '[':
		for first := true; ; first = false {
			if more, err := p.element(first); err != nil || !more {
				return err
			}
			if err := p.walk(mode); err != nil {
				return err
			}
		}
	case '{':
		for first := true; ; first = false {
			key, more, err := p.member(first)
			if err != nil || !more {
				return err
			}
			switch mode {
			case schemaText:
				p.countKey(key)
				err = p.walk(mode)
			case contentText:
				err = p.contentMember(key)
			default:
				err = p.walk(mode)
			}
			if err != nil {
				return err
			}
		}
	}
	return p.skip()
}

// contentMember reads the value of one member of a content part.
func (p *parser) contentMember(key []byte) error {
	switch string(key) {
	case "image_url":
		p.images++
		return p.skip()
	case "source":
		if p.ep == AnthropicMessages { // an image or a document's data
			p.images++
			return p.skip()
		}
	case "tool_use_id", "signature":
		if p.ep == AnthropicMessages {
			return p.skip()
		}
	case "inlineData", "inline_data", "fileData":
		if p.ep == GeminiGenerateContent { // media, by value or by URI
			p.images++
			return p.skip()
		}
	case "thoughtSignature", "thought_signature", "mimeType", "mime_type":
		if p.ep == GeminiGenerateContent {
			return p.skip()
		}
	case "type", "id", "call_id", "detail", "url", "file_id", "file_data", "data",
		"format", "input_audio", "file", "audio", "status", "encrypted_content":
		return p.skip()
	}
	return p.walk(contentText)
}

// countKey counts an object key of a schema as text (its ASCII bytes; the
// names of a schema are ASCII in practice).
func (p *parser) countKey(key []byte) {
	for _, b := range key {
		if b < utf8.RuneSelf {
			p.c.ascii(b)
		}
	}
	p.c.end()
}

// prompt counts a completions prompt or embeddings input: a string, or an
// array of strings, token ids or arrays of token ids (ids count exactly).
func (p *parser) prompt(level int) error {
	switch p.peek() {
	case '"':
		return p.text()
	case '[':
		if level >= 2 {
			return p.skip()
		}
		for first := true; ; first = false {
			if more, err := p.element(first); err != nil || !more {
				return err
			}
			var err error
			if b := p.peek(); b == '-' || b >= '0' && b <= '9' {
				p.c.f.exact++
				err = p.number()
			} else {
				err = p.prompt(level + 1)
			}
			if err != nil {
				return err
			}
		}
	}
	return p.skip()
}

// text counts a string value, unescaping it on the fly.
func (p *parser) text() error {
	if p.peek() != '"' {
		return p.skip()
	}
	p.pos++
	buf, c := p.buf, &p.c
	for i := p.pos; i < len(buf); {
		b := buf[i]
		switch {
		case b == '"':
			p.pos = i + 1
			c.end()
			return nil
		case b == '\\':
			p.pos = i
			r, n, err := p.escape(i)
			if err != nil {
				return err
			}
			if r < utf8.RuneSelf {
				c.ascii(byte(r))
			} else {
				c.rune(r)
			}
			i += n
		case b < 0x20:
			p.pos = i
			return p.errorf("control character in a string")
		case b < utf8.RuneSelf:
			if plainClass[b] == cStop { // DEL
				c.ascii(b)
				i++
			} else {
				i = run(c, buf, i)
			}
		default:
			r, n := utf8.DecodeRune(buf[i:])
			c.rune(r)
			i += n
		}
	}
	p.pos = len(buf)
	return p.errorf("unterminated string")
}

// escape decodes the escape sequence at buf[i] ('\\'): the rune and the
// bytes it spans. Surrogate pairs combine; a lone surrogate is U+FFFD.
func (p *parser) escape(i int) (rune, int, error) {
	buf := p.buf
	if i+1 >= len(buf) {
		return 0, 0, p.errorf("unterminated escape")
	}
	switch buf[i+1] {
	case '"', '\\', '/':
		return rune(buf[i+1]), 2, nil
	case 'b':
		return '\b', 2, nil
	case 'f':
		return '\f', 2, nil
	case 'n':
		return '\n', 2, nil
	case 'r':
		return '\r', 2, nil
	case 't':
		return '\t', 2, nil
	case 'u':
		r, ok := hex4(buf, i+2)
		if !ok {
			return 0, 0, p.errorf("bad \\u escape")
		}
		if r >= 0xD800 && r < 0xDC00 {
			if lo, ok := hex4(buf, i+8); ok && i+7 < len(buf) && buf[i+6] == '\\' && buf[i+7] == 'u' && lo >= 0xDC00 && lo < 0xE000 {
				return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), 12, nil
			}
			return utf8.RuneError, 6, nil
		}
		return r, 6, nil
	}
	return 0, 0, p.errorf("bad escape \\%c", buf[i+1])
}

func hex4(buf []byte, i int) (rune, bool) {
	if i+4 > len(buf) {
		return 0, false
	}
	var r rune
	for _, b := range buf[i : i+4] {
		switch {
		case b >= '0' && b <= '9':
			r = r<<4 | rune(b-'0')
		case b >= 'a' && b <= 'f':
			r = r<<4 | rune(b-'a'+10)
		case b >= 'A' && b <= 'F':
			r = r<<4 | rune(b-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// skipString moves past a string whose opening quote was consumed.
func (p *parser) skipString() error {
	buf := p.buf
	for i := p.pos; i < len(buf); i++ {
		switch b := buf[i]; {
		case b == '"':
			p.pos = i + 1
			return nil
		case b == '\\':
			i++ // the escaped byte; \u's hex digits are plain bytes
		case b < 0x20:
			p.pos = i
			return p.errorf("control character in a string")
		}
	}
	p.pos = len(buf)
	return p.errorf("unterminated string")
}

// stringValue reads a string value, unescaped; any other value reads as
// "" (a body with a wrongly typed field is the upstream's to refuse; the
// estimate goes on without it).
func (p *parser) stringValue() (string, error) {
	if p.peek() != '"' {
		return "", p.skip()
	}
	p.pos++
	start := p.pos
	if err := p.skipString(); err != nil {
		return "", err
	}
	raw := p.buf[start : p.pos-1]
	if !containsByte(raw, '\\') {
		return string(raw), nil
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			out = append(out, raw[i])
			i++
			continue
		}
		r, n, err := p.escape(start + i)
		if err != nil {
			return "", err
		}
		out = utf8.AppendRune(out, r)
		i += n
	}
	return string(out), nil
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// boolValue reads true; any other value reads as false.
func (p *parser) boolValue() (bool, error) {
	if p.peek() == 't' {
		return true, p.literal("true")
	}
	return false, p.skip()
}

// intValue reads a non-negative integer; any other value (null, a
// string, a negative number, a fraction) reads as 0 and values beyond
// 1<<40 as 1<<40: the upstream validates them, an estimate only needs a
// bound.
func (p *parser) intValue() (int64, error) {
	if b := p.peek(); b != '-' && (b < '0' || b > '9') {
		return 0, p.skip()
	}
	start := p.pos
	if err := p.number(); err != nil {
		return 0, err
	}
	var v int64
	for _, b := range p.buf[start:p.pos] {
		if b < '0' || b > '9' {
			return 0, nil // '-', '.', 'e': not a count
		}
		if v < 1<<40 {
			v = v*10 + int64(b-'0')
		}
	}
	return min(v, 1<<40), nil
}

// maxInt reads an integer value (intValue) and returns the larger of it
// and was.
func (p *parser) maxInt(was int64) (int64, error) {
	v, err := p.intValue()
	return max(was, v), err
}

func (p *parser) literal(lit string) error {
	if len(p.buf)-p.pos < len(lit) || string(p.buf[p.pos:p.pos+len(lit)]) != lit {
		return p.errorf("want %s", lit)
	}
	p.pos += len(lit)
	return nil
}

// number moves past a JSON number.
func (p *parser) number() error {
	start := p.pos
	buf := p.buf
	i := p.pos
	if i < len(buf) && buf[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(buf) && buf[i] >= '0' && buf[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if digits() == 0 {
		p.pos = start
		return p.errorf("want a value")
	}
	if i < len(buf) && buf[i] == '.' {
		i++
		if digits() == 0 {
			p.pos = i
			return p.errorf("bad number")
		}
	}
	if i < len(buf) && (buf[i] == 'e' || buf[i] == 'E') {
		i++
		if i < len(buf) && (buf[i] == '+' || buf[i] == '-') {
			i++
		}
		if digits() == 0 {
			p.pos = i
			return p.errorf("bad number")
		}
	}
	p.pos = i
	return nil
}

// skip moves past any value.
func (p *parser) skip() error {
	switch p.peek() {
	case '"', '{', '[':
		return p.walk(skipValue)
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	case 0:
		return p.errorf("unexpected end")
	}
	return p.number()
}
