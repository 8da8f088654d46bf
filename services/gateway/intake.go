package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// Headers a caller may send that the gateway reads.
const (
	headerRequestID = "X-Request-Id"
)

// serveAPI is the first stage of a request, intake: it names the request,
// authenticates its key, reads and checks its body, model and priority,
// then hands the call to the middleware (flags, estimate, settlement),
// which runs the proxy's stages (proxy.go). Every refusal here is answered
// before anything is metered.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	c := &call{endpoint: r.URL.Path, start: s.now(), route: "unknown", dialect: dialectOf(r.URL.Path)}
	if nw := newNativeWriter(w, c, s.now); nw != nil {
		defer nw.finish() // after the access log: it writes the held error
		w = nw
	}
	rw := &recorder{ResponseWriter: w, start: c.start}
	c.ep, _ = estimate.EndpointOf(r.URL.Path)
	c.requestID = r.Header.Get(headerRequestID)
	if !validID(c.requestID) {
		c.requestID = "req_" + randomHex(16)
	}
	rw.Header().Set(headerRequestID, c.requestID)
	if s.tracer != nil {
		r = s.startSpan(r, c)
	}
	defer s.finish(rw, c)

	if !s.intake(rw, r, c) {
		return
	}
	if deferralRequested(r) || s.degradedDeferral(r, c) {
		s.deferRequest(rw, r, c)
		return
	}
	c.eventID = eventIDFor(r, c.requestID)
	r.Body = io.NopCloser(bytes.NewReader(c.body)) // the middleware reads it again to estimate
	s.api.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
}

// intake fills c from r — caller, body, model and its route, priority
// class, deadline, user — or refuses r and returns false.
func (s *Server) intake(w http.ResponseWriter, r *http.Request, c *call) bool {
	if c.caller = s.callerOf(r); c.caller == nil {
		c.badRequest(w, http.StatusUnauthorized, "invalid_api_key", badKeyMessage)
		return false
	}
	if !c.caller.MayCall(r.URL.Path) {
		c.badRequest(w, http.StatusForbidden, "endpoint_not_allowed",
			fmt.Sprintf("The API key %s may not call %s; its endpoints are set where it was issued (the admin API).", c.caller.KeyID, r.URL.Path))
		return false
	}
	body, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			c.badRequest(w, http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("The request body exceeds this gateway's limit of %d bytes (services.gateway.max_body_bytes).", s.cfg.MaxBodyBytes))
			return false
		}
		c.badRequest(w, http.StatusBadRequest, "body_unreadable", "The request body could not be read.")
		return false
	}
	c.body = body
	if c.req, err = scanRequest(body); err != nil {
		c.badRequest(w, http.StatusBadRequest, "invalid_json", "We could not parse the JSON body of your request: "+err.Error())
		return false
	}
	c.bodyModel = c.req.Model
	if d, ok := azureDeployment(r.URL.Path); ok {
		// Azure serves the deployment its URL names, whatever the body
		// says: so does the gateway (the deployment is the model's name).
		c.req.Model = d
	}
	if model, method, ok := geminiTarget(r.URL.Path); ok {
		// Gemini's path names the model and whether to stream.
		c.req.Model, c.req.Stream = model, method == geminiStream
		c.sse = c.req.Stream && r.URL.Query().Get("alt") == "sse"
	}
	return s.intakeModel(w, c) && s.intakeClass(w, r, c)
}

// intakeModel checks the model c asks for: named, one the key may use,
// and one some upstream serves (c.ups, c.route).
func (s *Server) intakeModel(w http.ResponseWriter, c *call) bool {
	model := c.req.Model
	if model == "" || len(model) > schemas.MaxModelLen {
		c.badParam(w, http.StatusBadRequest, "model", "missing_model",
			fmt.Sprintf("You must provide a model parameter (1 to %d bytes).", schemas.MaxModelLen))
		return false
	}
	c.ups, c.route = s.routes.Load().lookup(c.dialect, model)
	switch {
	case !c.caller.MayUse(model):
		c.badParam(w, http.StatusForbidden, "model", "model_not_allowed",
			fmt.Sprintf("The API key %s may not use the model `%s`; GET /v1/models lists the models it may use.", c.caller.KeyID, model))
		return false
	case c.ups == nil:
		c.route = "unknown"
		c.badParam(w, http.StatusNotFound, "model", "model_not_found",
			fmt.Sprintf("The model `%s` does not exist or is not served by this gateway.", model))
		return false
	case s.policy().Refuses(c.caller.Tenant, model, s.now().Unix()):
		// A money budget cannot hold against spend nobody priced
		// (policy "Prices", unpriced: refuse).
		c.badParam(w, http.StatusForbidden, "model", "model_unpriced", policy.UnpricedRefusal(c.caller.Tenant, model))
		return false
	}
	return true
}

// intakeClass sets c's priority class, deadline and end user.
func (s *Server) intakeClass(w http.ResponseWriter, r *http.Request, c *call) bool {
	var err error
	if c.priority, err = s.classOf(c.caller, r.Header.Get(priority.Header)); err != nil {
		if errors.Is(err, priority.ErrRaiseNotAllowed) {
			c.refuse(w, http.StatusForbidden, ratelimit.Error{Type: "permission_denied", Code: "priority_not_allowed",
				Message: fmt.Sprintf("%v. The API key %s may only lower its priority; ask for may_set_priority in the gateway's keys file.", err, c.caller.KeyID)}, 0)
			return false
		}
		c.badRequest(w, http.StatusBadRequest, "invalid_priority", err.Error()+".")
		return false
	}
	if c.deadline, err = priority.DeadlineOf(r.Header.Get(priority.TimeoutHeader), c.start); err != nil {
		c.badRequest(w, http.StatusBadRequest, "invalid_timeout", err.Error()+".")
		return false
	}
	c.user = c.caller.User
	if c.user == "" && len(c.req.User) <= schemas.MaxStringLen {
		c.user = c.req.User
	}
	if c.session = r.Header.Get(HeaderSession); len(c.session) > schemas.MaxStringLen {
		c.badRequest(w, http.StatusBadRequest, "invalid_session", fmt.Sprintf("%s: %d bytes is longer than %d.", HeaderSession, len(c.session), schemas.MaxStringLen))
		return false
	}
	return true
}

// HeaderSession names the agent session or conversation a call belongs
// to: the usage event's session_id, and the session limits scoped by
// session count (a budget per agent task, say). At most
// schemas.MaxStringLen bytes.
const HeaderSession = "X-Sluice-Session"

// classOf is the class c's request runs under: the key's or its tenant's
// policy class, moved by the X-Sluice-Priority header (Caller.PriorityOf).
func (s *Server) classOf(c *frontend.Caller, header string) (schemas.Priority, error) {
	return c.PriorityOf(s.policy().Tenant(c.Tenant).Class(), header)
}

// eventIDFor is the usage event id of a call: built by the gateway, never
// the client's x-request-id. Sluice deduplicates events, and admission
// marks settlements, by id: an id a client chose could be chosen again —
// by another tenant, or at another gateway replica — and that call would
// go unmetered. A deferred task's run keeps the request id the gateway
// made for it (<task id>-<run>).
func eventIDFor(r *http.Request, requestID string) string {
	if deferredCaller(r.Context()) != nil {
		return requestID
	}
	return "evt_" + randomHex(16)
}

// readBody reads at most limit bytes of r's body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
}

// validID reports whether a client's x-request-id is kept (answered back,
// sent upstream, recorded as the event's request_id attribute): 1 to 128
// bytes of printable ASCII without spaces.
func validID(id string) bool {
	if id == "" || len(id) > schemas.MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// authenticate returns r's caller, or answers 401 and returns nil. A
// deferred task's run is authenticated as its key (deferred.go).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) *frontend.Caller {
	c := s.callerOf(r)
	if c == nil {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", badKeyMessage)
	}
	return c
}

// badKeyMessage answers a request without a known tenant key.
const badKeyMessage = "Incorrect API key provided. Send a Sluice gateway key as Authorization: Bearer <key> (or x-api-key:, api-key: or x-goog-api-key: <key>)."

// callerOf returns the tenant key r authenticates with (a deferred task's
// run: its key), nil for none.
func (s *Server) callerOf(r *http.Request) *frontend.Caller {
	if c := deferredCaller(r.Context()); c != nil {
		return c
	}
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if key == "" {
		key = r.Header.Get("X-Api-Key") // Anthropic's clients send their key so
	}
	if key == "" {
		key = r.Header.Get("Api-Key") // and Azure OpenAI's so
	}
	if key == "" {
		key = r.Header.Get("X-Goog-Api-Key") // and Google's so,
	}
	if key == "" && isGeminiPath(r.URL.Path) {
		key = r.URL.Query().Get("key") // or in the URL, on Gemini's paths only
	}
	key = strings.TrimSpace(key)
	if c := s.keys.Authenticate(key); c != nil || s.topic == nil {
		return c
	}
	return s.topic.Authenticate(key, s.now())
}

// keyByID returns the caller of key id of tenant, from the keys file or
// the admin API's keys, or nil when neither accepts it now.
func (s *Server) keyByID(tenant, id string) *frontend.Caller {
	for _, c := range s.keys.Keys().Values() {
		if c.KeyID == id && c.Tenant == tenant {
			return c
		}
	}
	if s.topic == nil {
		return nil
	}
	return s.topic.ByID(tenant, id, s.now())
}

// writeError answers an OpenAI error body.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	ratelimit.WriteError(w, status, ratelimit.Error{Type: typ, Code: code, Message: msg}, 0)
}

// azurePrefix begins Azure OpenAI's deployment URLs, which the gateway
// serves to Azure's clients: /openai/deployments/<deployment>/<operation>.
const azurePrefix = "/openai/deployments/"

// azureDeployment returns the deployment an Azure OpenAI URL names.
func azureDeployment(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, azurePrefix)
	if !ok {
		return "", false
	}
	d, _, ok := strings.Cut(rest, "/")
	return d, ok && d != ""
}
