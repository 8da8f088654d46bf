package gateway

import (
	"encoding/json"

	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/providerusage"
)

// doc is the part of an answer, or of one streamed event, that says what
// was used or generated: usage where the provider reports it, and the
// generated text to count where it does not.
type doc struct {
	Usage   *providerusage.OpenAI `json:"usage"`
	Choices []struct {
		Text    string   `json:"text"`
		Message *message `json:"message"`
		Delta   *message `json:"delta"`
	} `json:"choices"`

	// The Responses API: a whole response, or a streamed event (type,
	// delta) wrapping one (response).
	Type     string       `json:"type"`
	Delta    string       `json:"delta"`
	Output   []outputItem `json:"output"`
	Response *doc         `json:"response"`
}

type message struct {
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Refusal          string          `json:"refusal"`
	ToolCalls        []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type outputItem struct {
	Type      string `json:"type"`
	Arguments string `json:"arguments"`
	Content   []struct {
		Text string `json:"text"`
	} `json:"content"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// reported returns the usage doc carries, if any: its own or that of the
// response it wraps (response.completed and its kin).
func (d *doc) reported() *providerusage.OpenAI {
	if d.Usage != nil {
		return d.Usage
	}
	if d.Response != nil {
		return d.Response.Usage
	}
	return nil
}

// count returns the tokens of the text doc generated, with fam's weights:
// choices' text, message or delta content, reasoning, refusals and tool
// call arguments; a whole response's output; a Responses event's delta.
func (d *doc) count(fam estimate.Family) int64 {
	var n int64
	add := func(s string) {
		if s != "" {
			n += estimate.Count(fam, s)
		}
	}
	for _, c := range d.Choices {
		add(c.Text)
		for _, m := range []*message{c.Message, c.Delta} {
			if m == nil {
				continue
			}
			var s string
			if len(m.Content) > 0 && m.Content[0] == '"' && json.Unmarshal(m.Content, &s) == nil {
				add(s)
			}
			add(m.ReasoningContent)
			add(m.Refusal)
			for _, tc := range m.ToolCalls {
				add(tc.Function.Name)
				add(tc.Function.Arguments)
			}
		}
	}
	switch d.Type {
	case "response.output_text.delta", "response.function_call_arguments.delta", "response.refusal.delta",
		"response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		add(d.Delta)
	case "":
		for _, o := range d.Output {
			add(o.Arguments)
			for _, c := range o.Content {
				add(c.Text)
			}
			for _, s := range o.Summary {
				add(s.Text)
			}
		}
	}
	return n
}
