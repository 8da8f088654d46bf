package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/providerusage"
)

// Google's Gemini API, passed through natively (dialect.go):
// POST /v1/models/{model}:generateContent and :streamGenerateContent (or
// /v1beta/…) go to an upstream of dialect gemini, the model named by the
// path, and
// the gateway reads the usageMetadata Gemini reports (in the answer, or in
// every event of a stream, cumulatively). Its refusals are Google's error
// body ({"error":{"code","message","status"}}), which google-genai raises
// as its own errors (a 429 as ClientError with status RESOURCE_EXHAUSTED).

// geminiPrefixes begin the Gemini paths the gateway serves: google-genai
// calls v1 by default, Google's older SDKs and REST examples v1beta. The
// upstream's base URL carries the version it is called with
// (…/v1beta serves both versions' models).
var geminiPrefixes = [...]string{"/v1/models/", "/v1beta/models/"}

// isGeminiPath reports whether path is under one of geminiPrefixes.
func isGeminiPath(path string) bool {
	for _, p := range geminiPrefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// Gemini's methods the gateway serves, the part of the path after the
// model: the two that generate, and the token count (not metered).
const (
	geminiGenerate = "generateContent"
	geminiStream   = "streamGenerateContent"
	geminiCount    = "countTokens"
)

// geminiTarget returns the model and the method a Gemini path names
// (/v1beta/models/gemini-2.5-flash:streamGenerateContent); ok is false for
// another path or a method the gateway does not serve.
func geminiTarget(path string) (model, method string, ok bool) {
	var rest string
	for _, p := range geminiPrefixes {
		if r, found := strings.CutPrefix(path, p); found {
			rest, ok = r, true
		}
	}
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || strings.Contains(rest[:i], "/") {
		return "", "", false
	}
	model, method = rest[:i], rest[i+1:]
	return model, method, method == geminiGenerate || method == geminiStream || method == geminiCount
}

// serveGemini serves a Gemini path: a generation method goes through the
// API's stages like any call (serveAPI), countTokens is passed through
// unmetered (serveCountTokens); another (embedContent, …) is answered 404
// in Google's shape.
func (s *Server) serveGemini(w http.ResponseWriter, r *http.Request) {
	_, method, ok := geminiTarget(r.URL.Path)
	if ok && method == geminiCount {
		s.serveCountTokens(w, r)
		return
	}
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write(geminiShape{}.errorBody(http.StatusNotFound,
			"This gateway serves Gemini's /v1/models/{model}:generateContent, :streamGenerateContent and :countTokens (or /v1beta/…), not "+r.URL.Path+"."))
		return
	}
	s.serveAPI(w, r)
}

// geminiOperation is the part of an upstream's URL after the model for a
// call to path: the method, and alt=sse when the client asked for Server
// Sent Events rather than Gemini's default stream, a JSON array.
func geminiOperation(path string, sse bool) string {
	_, method, _ := geminiTarget(path)
	if sse {
		return ":" + method + "?alt=sse"
	}
	return ":" + method
}

// geminiURL is where a gemini upstream at base serves model's method.
func geminiURL(base, model, op string) string {
	return base + "/models/" + url.PathEscape(model) + op
}

// geminiDoc is a GenerateContentResponse, whole or one event of a stream:
// what it generated and what it used.
type geminiDoc struct {
	Candidates []struct {
		Content struct {
			Parts []struct {
				Text         string `json:"text"`
				FunctionCall *struct {
					Name string          `json:"name"`
					Args json.RawMessage `json:"args"`
				} `json:"functionCall"`
			} `json:"parts"`
		} `json:"content"`
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
	UsageMetadata *providerusage.Gemini `json:"usageMetadata"`
}

// count returns the tokens of the text d generated, with fam's weights.
func (d *geminiDoc) count(fam estimate.Family) int64 {
	var n int64
	for _, c := range d.Candidates {
		for _, p := range c.Content.Parts {
			if p.Text != "" {
				n += estimate.Count(fam, p.Text)
			}
			if p.FunctionCall != nil {
				n += estimate.Count(fam, p.FunctionCall.Name+string(p.FunctionCall.Args))
			}
		}
	}
	return n
}

// finished reports whether d ends the generation: a candidate has its
// finishReason, and the usage it carries is the call's whole.
func (d *geminiDoc) finished() bool {
	for _, c := range d.Candidates {
		if c.FinishReason != "" {
			return true
		}
	}
	return false
}

// geminiWhole reads the usage of a whole answer: a response, or the JSON
// array of responses a stream without alt=sse is (its last usage is the
// call's); the text counted when it reports none. ok is false for an
// answer that is not JSON.
func geminiWhole(data []byte, fam estimate.Family, prompt int64) (u middleware.Usage, src usageSource, ok bool) {
	var docs []geminiDoc
	if err := json.Unmarshal(data, &docs); err != nil {
		var d geminiDoc
		if json.Unmarshal(data, &d) != nil {
			return u, usageEstimate, false
		}
		docs = []geminiDoc{d}
	}
	var counted int64
	var last *providerusage.Gemini
	for i := range docs {
		counted += docs[i].count(fam)
		if docs[i].UsageMetadata != nil {
			last = docs[i].UsageMetadata
		}
	}
	if last != nil {
		return last.Usage(), usageReported, true
	}
	return middleware.Usage{PromptTokens: prompt, CompletionTokens: counted, Counted: true}, usageCounted, true
}

// geminiEvent reads one event of a Gemini stream: each carries the usage
// so far (the prompt from the first), the last one with a finishReason
// the call's whole; the text is counted should the stream end before.
func (st *streamState) geminiEvent(data []byte) {
	var d geminiDoc
	if json.Unmarshal(data, &d) != nil {
		return
	}
	if d.UsageMetadata != nil {
		u := d.UsageMetadata.Usage()
		st.reported = &u
	}
	st.final = st.final || (d.finished() && d.UsageMetadata != nil)
	st.counted += d.count(st.fam)
}

// geminiShape writes the gateway's errors on Gemini's routes as Google's
// API does: {"error":{"code":429,"message":…,"status":"RESOURCE_EXHAUSTED"}},
// with the Retry-After the refusal set.
type geminiShape struct{}

func (geminiShape) errorBody(status int, msg string) []byte {
	type body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
	}
	out, _ := json.Marshal(struct {
		Error body `json:"error"`
	}{body{Code: status, Message: msg, Status: googleStatus(status)}})
	return out
}

// headers leaves the answer's headers as they are: Google's API has no
// rate-limit headers of its own, and OpenAI's x-ratelimit-* tell a client
// that reads them what the gateway's limits are.
func (geminiShape) headers(http.Header, time.Time) {}

// googleStatus is the canonical status Google's APIs give an HTTP status.
func googleStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusConflict:
		return "ABORTED"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case 499:
		return "CANCELLED"
	case http.StatusNotImplemented:
		return "UNIMPLEMENTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	if status < 500 {
		return "FAILED_PRECONDITION"
	}
	return "INTERNAL"
}

// relayGeminiArray relays Gemini's default stream, a JSON array of
// responses sent as they are generated: the bytes pass to the client as
// they arrive (flushed at each read), and each element, once whole, is
// read for its usage and text as an SSE event would be (geminiEvent). An
// element longer than max_stream_event_bytes, or a body that is not an
// array, is passed on unread from there. It ends like relayStream.
func (s *Server) relayGeminiArray(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, fam estimate.Family, prompt int64) {
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	st := &streamState{w: w, rc: rc, fam: fam, max: s.cfg.MaxStreamEventBytes, dialect: c.dialect}
	src := &arraySource{r: resp.Body, st: st}
	err := src.elements()
	if err == nil && !st.clientGone {
		// The rest (the closing bracket, or what was not read as elements).
		src.unbounded = true
		_, err = io.Copy(io.Discard, src)
	}
	if errors.Is(err, errClientGone) {
		err = nil
	}
	s.endStream(r, c, st, err, prompt)
}

// errClientGone and errElementTooLarge stop arraySource's reader: the
// client left, or an element outgrew the bound.
var (
	errClientGone      = errors.New("the client went away")
	errElementTooLarge = errors.New("stream element too large")
)

// arraySource reads an upstream's JSON-array stream, passing every byte
// read to the client at once; n counts the bytes read since the last
// element ended, bounded by st.max until unbounded.
type arraySource struct {
	r         io.Reader
	st        *streamState
	n         int
	unbounded bool
}

func (a *arraySource) Read(p []byte) (int, error) {
	if !a.unbounded && a.n > a.st.max {
		return 0, errElementTooLarge
	}
	n, err := a.r.Read(p)
	if n > 0 {
		a.n += n
		if !a.st.write(p[:n], true) {
			return n, errClientGone
		}
	}
	return n, err
}

// elements reads the array element by element; nil when the rest is to
// be passed on unread (its end, a body that is not an array, an element
// too large), else the read error (io.EOF: the stream ended early).
func (a *arraySource) elements() error {
	dec := json.NewDecoder(a)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return a.unread(err)
	}
	for dec.More() {
		var el json.RawMessage
		if err := dec.Decode(&el); err != nil {
			return a.unread(err)
		}
		a.n = 0
		a.st.geminiEvent(el)
	}
	return nil
}

// unread says what a decoding error means: the reader's own errors stop
// the relay; JSON the decoder cannot follow leaves the rest unread.
func (a *arraySource) unread(err error) error {
	var syntax *json.SyntaxError
	switch {
	case err == nil, errors.Is(err, errElementTooLarge), errors.As(err, &syntax):
		return nil
	case errors.Is(err, io.ErrUnexpectedEOF):
		return io.EOF
	}
	return err
}
