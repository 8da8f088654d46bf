package traceprop

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span attributes of a metered call: the OpenTelemetry GenAI semantic
// conventions' names (gen_ai.system is the older name of
// gen_ai.provider.name; both are set, for the backends that read either),
// and Sluice's own.
const (
	AttrOperation     = "gen_ai.operation.name"
	AttrSystem        = "gen_ai.system"
	AttrProvider      = "gen_ai.provider.name"
	AttrRequestModel  = "gen_ai.request.model"
	AttrResponseModel = "gen_ai.response.model"
	AttrInputTokens   = "gen_ai.usage.input_tokens"
	AttrOutputTokens  = "gen_ai.usage.output_tokens"
	AttrStatus        = "http.response.status_code"
	AttrTenant        = "sluice.tenant"
	AttrAPIKeyID      = "sluice.api_key_id"
	AttrOutcome       = "sluice.outcome"
	AttrEventID       = "sluice.event_id"
	AttrRequestID     = "sluice.request_id"
	AttrCode          = "sluice.error_code"
)

// Operation is the gen_ai.operation.name of an OpenAI API path.
func Operation(path string) string {
	switch path {
	case "/v1/chat/completions":
		return "chat"
	case "/v1/completions":
		return "text_completion"
	case "/v1/embeddings":
		return "embeddings"
	case "/v1/responses":
		return "responses"
	}
	return "llm_call"
}

// SpanName is the name of a call's span: "{operation} {model}", as the
// GenAI conventions name client and server spans.
func SpanName(path, model string) string {
	if model == "" {
		return Operation(path)
	}
	return Operation(path) + " " + model
}

// Call is what a call's span records when it ends.
type Call struct {
	Path          string
	Provider      string // the upstream that served the call, as usage events name it
	RequestModel  string
	ResponseModel string
	Tenant        string
	APIKeyID      string
	EventID       string
	InputTokens   int64
	OutputTokens  int64
	Billed        bool   // the token counts are known (the provider's, or counted)
	Outcome       string // the usage event's outcome; empty for a client that left
	Status        int    // the HTTP status answered; 0 for none
	Code          string // the error code answered, or why the call ended without one
}

// End records c on span and ends it. A status of 500 or more marks the
// span as an error, as the HTTP server conventions do; refusals (4xx) are
// the gateway doing its job, not errors.
func (c *Call) End(span trace.Span) {
	if !span.IsRecording() {
		span.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 14)
	attrs = append(attrs, attribute.String(AttrOperation, Operation(c.Path)))
	add := func(k, v string) {
		if v != "" {
			attrs = append(attrs, attribute.String(k, v))
		}
	}
	add(AttrProvider, c.Provider)
	add(AttrSystem, c.Provider)
	add(AttrRequestModel, c.RequestModel)
	add(AttrResponseModel, c.ResponseModel)
	add(AttrTenant, c.Tenant)
	add(AttrAPIKeyID, c.APIKeyID)
	add(AttrEventID, c.EventID)
	add(AttrOutcome, c.Outcome)
	add(AttrCode, c.Code)
	if c.Billed {
		attrs = append(attrs, attribute.Int64(AttrInputTokens, c.InputTokens), attribute.Int64(AttrOutputTokens, c.OutputTokens))
	}
	if c.Status != 0 {
		attrs = append(attrs, attribute.Int(AttrStatus, c.Status))
	}
	span.SetAttributes(attrs...)
	if c.Status >= 500 {
		span.SetStatus(codes.Error, c.Code)
	}
	span.End()
}
