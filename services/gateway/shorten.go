package gateway

import (
	"encoding/json"
	"strconv"

	"github.com/sluicehq/sluice/policy"
)

// HeaderMaxTokens is on an answer a degradation level served shortened
// (degradation action shorten): the output cap the gateway sent the
// upstream in place of the request's.
const HeaderMaxTokens = "X-Sluice-Max-Tokens"

// outputCaps are the members that cap a request's output, by dialect
// (OpenAI's chat, completions and responses each name theirs; Azure
// speaks OpenAI's): the request's own are lowered to the cap, and when
// it sets none the first listed for its operation is added.
func outputCaps(dialect, operation string) []string {
	switch dialect {
	case policy.DialectAnthropic:
		return []string{"max_tokens"}
	}
	switch operation {
	case "/responses":
		return []string{"max_output_tokens"}
	case "/completions":
		return []string{"max_tokens"}
	}
	// Chat: max_completion_tokens is the one every current model takes
	// (reasoning models refuse max_tokens).
	return []string{"max_completion_tokens", "max_tokens"}
}

// withMaxTokens returns body with its output capped at limit: each cap
// member it sets above limit (or to anything but a number) lowered to
// it, or the operation's cap member added when it sets none. Only a
// shortened call pays for it, so it re-encodes the top-level object
// rather than splicing bytes; scanRequest has already refused bodies
// whose member names repeat, so decoding loses nothing the provider
// would read.
func withMaxTokens(body []byte, dialect, operation string, limit int64) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, err
	}
	if dialect == policy.DialectGemini {
		// Gemini caps the output inside generationConfig (which its
		// decoders also read as generation_config).
		name := "generationConfig"
		if _, ok := members["generation_config"]; ok {
			name = "generation_config"
		}
		cfg := []byte("{}")
		if v, ok := members[name]; ok && string(v) != "null" {
			cfg = v
		}
		capped, err := capMembers(cfg, []string{"maxOutputTokens", "max_output_tokens"}, limit)
		if err != nil {
			return nil, err
		}
		members[name] = capped
		return json.Marshal(members)
	}
	return capMembersOf(members, outputCaps(dialect, operation), limit)
}

// capMembers is capMembersOf on the JSON object obj.
func capMembers(obj []byte, names []string, limit int64) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(obj, &members); err != nil {
		return nil, err
	}
	return capMembersOf(members, names, limit)
}

// capMembersOf lowers each of names that members set above limit (or to
// anything but a number) to it, or adds the first when none is set, and
// encodes the result.
func capMembersOf(members map[string]json.RawMessage, names []string, limit int64) ([]byte, error) {
	capped := json.RawMessage(strconv.FormatInt(limit, 10))
	set := false
	for _, name := range names {
		v, ok := members[name]
		if !ok || string(v) == "null" {
			continue
		}
		set = true
		if n, err := strconv.ParseInt(string(v), 10, 64); err != nil || n > limit {
			members[name] = capped
		}
	}
	if !set {
		members[names[0]] = capped
	}
	return json.Marshal(members)
}
