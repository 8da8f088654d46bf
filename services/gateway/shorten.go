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
	capped := json.RawMessage(strconv.FormatInt(limit, 10))
	names := outputCaps(dialect, operation)
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
