// Package providerusage reads what an LLM provider says a call used — the
// usage block of OpenAI's answers (chat, completions, embeddings and the
// Responses API), Anthropic's messages and Gemini's usageMetadata — into
// the token types Sluice meters (middleware.Usage): prompt tokens with the
// cached and cache-write parts in them, completion tokens with the
// reasoning part in them.
//
// It is the one reading of each provider's figures: sluice gateway uses it
// for answers and for each event of a stream, and the Python SDK
// (sluice_metering.usage) reads the same way, both checked against the
// vectors in testdata/vectors.json, so that a gateway built on either SDK
// meters a provider exactly as sluice gateway does.
package providerusage

import (
	"encoding/json"
	"fmt"

	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// The dialects FromResponse reads: the APIs whose answers it knows (Azure
// OpenAI answers in OpenAI's shape).
const (
	DialectOpenAI    = "openai"
	DialectAzure     = "azure"
	DialectAnthropic = "anthropic"
	DialectGemini    = "gemini"
)

// OpenAI is OpenAI's usage block in both of its shapes: chat
// completions, completions and embeddings (prompt/completion tokens with
// their details) and the Responses API (input/output tokens).
type OpenAI struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`

	PromptDetails     *CachedDetails    `json:"prompt_tokens_details"`
	InputDetails      *CachedDetails    `json:"input_tokens_details"`
	CompletionDetails *ReasoningDetails `json:"completion_tokens_details"`
	OutputDetails     *ReasoningDetails `json:"output_tokens_details"`
}

// CachedDetails is the part of OpenAI's prompt details Sluice meters.
type CachedDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// ReasoningDetails is the part of OpenAI's completion details Sluice
// meters.
type ReasoningDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// Usage is u in Sluice's token types.
func (u *OpenAI) Usage() middleware.Usage {
	out := middleware.Usage{PromptTokens: u.PromptTokens + u.InputTokens, CompletionTokens: u.CompletionTokens + u.OutputTokens}
	for _, d := range []*CachedDetails{u.PromptDetails, u.InputDetails} {
		if d != nil {
			out.CachedTokens += d.CachedTokens
		}
	}
	for _, d := range []*ReasoningDetails{u.CompletionDetails, u.OutputDetails} {
		if d != nil {
			out.ReasoningTokens += d.ReasoningTokens
		}
	}
	return out
}

// Anthropic is the usage block of Anthropic's messages, of
// message_start's message and of message_delta. input_tokens leaves the
// cache out: the prompt billed is the three input counts together.
type Anthropic struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// Usage is u in Sluice's token types.
func (u *Anthropic) Usage() middleware.Usage {
	return middleware.Usage{PromptTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens,
		CompletionTokens: u.OutputTokens, CachedTokens: u.CacheReadInputTokens, CacheWriteTokens: u.CacheCreationInputTokens}
}

// Gemini is Gemini's usageMetadata. promptTokenCount includes the cached
// content; the thoughts are billed as output beside the candidates, and a
// tool's results as input beside the prompt.
type Gemini struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
	ToolUsePromptTokenCount int64 `json:"toolUsePromptTokenCount"`
	TotalTokenCount         int64 `json:"totalTokenCount"`
}

// Usage is u in Sluice's token types.
func (u *Gemini) Usage() middleware.Usage {
	return middleware.Usage{PromptTokens: u.PromptTokenCount + u.ToolUsePromptTokenCount,
		CompletionTokens: u.CandidatesTokenCount + u.ThoughtsTokenCount,
		CachedTokens:     u.CachedContentTokenCount, ReasoningTokens: u.ThoughtsTokenCount}
}

// FromResponse reads the usage of a whole (not streamed) answer of
// dialect. ok is false when the answer reports none (Sluice then counts
// the tokens itself); an answer that is not JSON is an error.
func FromResponse(dialect string, body []byte) (u middleware.Usage, ok bool, err error) {
	var d struct {
		Usage         json.RawMessage `json:"usage"`
		UsageMetadata json.RawMessage `json:"usageMetadata"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		return u, false, fmt.Errorf("providerusage: the answer is not a JSON object: %w", err)
	}
	switch dialect {
	case DialectOpenAI, DialectAzure:
		return read[OpenAI](d.Usage)
	case DialectAnthropic:
		return read[Anthropic](d.Usage)
	case DialectGemini:
		return read[Gemini](d.UsageMetadata)
	}
	return u, false, fmt.Errorf("providerusage: unknown dialect %q (want openai, azure, anthropic or gemini)", dialect)
}

// read decodes one provider's usage block raw, if there is one.
func read[T any, P interface {
	*T
	Usage() middleware.Usage
}](raw json.RawMessage) (middleware.Usage, bool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return middleware.Usage{}, false, nil
	}
	var u T
	if err := json.Unmarshal(raw, &u); err != nil {
		return middleware.Usage{}, false, fmt.Errorf("providerusage: the usage block: %w", err)
	}
	return P(&u).Usage(), true, nil
}
