package estimate

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestCountMatchesTheTokenizers compares Count with the real tokenizers'
// counts of the corpus. testdata/corpus/counts.tsv holds them, made with
// github.com/tiktoken-go/tokenizer v0.10.0 (a pure-Go port of OpenAI's
// tiktoken with the o200k_base and cl100k_base vocabularies), which the
// project does not link: re-run that tokenizer over a file added to the
// corpus and add its line. What a gateway depends on is that the debit is
// close in total and never wildly off for one kind of text.
func TestCountMatchesTheTokenizers(t *testing.T) {
	f, err := os.Open("testdata/corpus/counts.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var est, exact [2]int64
	files := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		cols := strings.Split(line, "\t")
		if len(cols) != 3 {
			t.Fatalf("counts.tsv line %q: want file, o200k, cl100k", line)
		}
		text := readTestdata(t, "corpus", cols[0])
		files++
		for i, fam := range []Family{O200k, Cl100k} {
			want, err := strconv.ParseInt(cols[1+i], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			got := Count(fam, string(text))
			est[i] += got
			exact[i] += want
			if off := float64(got)/float64(want) - 1; math.Abs(off) > 0.25 {
				t.Errorf("%s %v: counted %d, the tokenizer %d (%+.0f%%, more than 25%% off)", cols[0], fam, got, want, 100*off)
			}
		}
	}
	if files < 10 {
		t.Fatalf("only %d corpus files", files)
	}
	for i, fam := range []Family{O200k, Cl100k} {
		if off := float64(est[i])/float64(exact[i]) - 1; math.Abs(off) > 0.05 {
			t.Errorf("%v: corpus counted %d, the tokenizer %d (%+.1f%%, more than 5%% off)", fam, est[i], exact[i], 100*off)
		}
	}
}

func TestCountPieces(t *testing.T) {
	for _, c := range []struct {
		text string
		want int64
	}{
		{"", 0},
		{"hello", 1},
		{"hello world", 2},
		{"1234567", 3}, // the pre-split takes three digits at a time
		{"r.mu.Lock()", 4},
		{"模型", 1}, // 2 × 0.69
		{"a\n\nb", 3},
	} {
		if got := Count(O200k, c.text); got != c.want {
			t.Errorf("Count(o200k, %q) = %d, want %d", c.text, got, c.want)
		}
	}
	// cl100k's vocabulary holds fewer non-Latin pieces than o200k's.
	if o, c := Count(O200k, "Переход прошёл спокойно"), Count(Cl100k, "Переход прошёл спокойно"); c <= o {
		t.Errorf("Russian: cl100k %d not above o200k %d", c, o)
	}
}

func TestFamilyOf(t *testing.T) {
	for model, want := range map[string]Family{
		"gpt-4o": O200k, "gpt-4o-mini-2024-07-18": O200k, "openai/gpt-4.1-nano": O200k, "o3-mini": O200k, "o1": O200k,
		"gpt-5": O200k, "ft:gpt-4o-mini:acme::abc123": O200k, "GPT-4o": O200k, "chatgpt-4o-latest": O200k,
		"gpt-4": Cl100k, "gpt-4-turbo": Cl100k, "gpt-3.5-turbo-0125": Cl100k, "azure/gpt-35-turbo": Cl100k,
		"text-embedding-3-small": Cl100k, "text-embedding-ada-002": Cl100k,
		"claude-3-5-sonnet": Other, "llama-3.1-70b": Other, "": Other, "o": Other,
	} {
		if got := FamilyOf(model); got != want {
			t.Errorf("FamilyOf(%q) = %v, want %v", model, got, want)
		}
	}
}

// readTestdata is the file testdata/<elem...>; a missing one fails t.
func readTestdata(t testing.TB, elem ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{"testdata"}, elem...)...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readRequest is the request body testdata/requests/<name>.
func readRequest(t testing.TB, name string) []byte {
	t.Helper()
	return readTestdata(t, "requests", name)
}

// features of the texts, as the counter sees them one by one: what Parse
// must have counted for a body made of them.
func textTokens(fam Family, texts ...string) int64 {
	var c counter
	for _, s := range texts {
		for i := 0; i < len(s); i++ {
			c.ascii(s[i]) // the tests' texts are ASCII
		}
		c.end()
	}
	return c.f.tokens(fam)
}

// TestParseChat: the text of every message (content parts, tool calls,
// tool results) and of the tool definitions is counted, with OpenAI's
// per-message overhead and one image; the image's URL, ids and types are
// not text.
func TestParseChat(t *testing.T) {
	req, err := Parse(ChatCompletions, readRequest(t, "chat_tools.json"), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "gpt-4o-2024-08-06" || req.Family != O200k || !req.Stream || req.MaxOutputTokens != 400 || req.Choices != 2 ||
		req.Images != 1 || req.Endpoint != ChatCompletions {
		t.Fatalf("%+v", req)
	}
	texts := []string{
		"system", "You are a support assistant for Sluice, a metering service for LLM gateways. Answer briefly and cite the relevant setting.",
		"user", "Our gateway answers 429 to tenant \"acme\" but the dashboard shows only 64% of the hourly quota used. Screenshot attached.\nWhat should I check first?",
		"assistant", "get_flags", `{"tenant":"acme"}`,
		"tool", "call_9f2c", `{"*":{"state":"throttle","kind":"rate","quota":"requests_per_minute","limit":600,"used":641}}`,
	}
	// tool definitions: keys and strings
	schema := []string{"type", "function", "function", "name", "get_flags", "description", "Read the enforcement flags Sluice holds for a tenant.",
		"parameters", "type", "object", "properties", "tenant", "type", "string", "description", "Tenant name", "required", "tenant"}
	want := textTokens(O200k, append(texts, schema...)...) + 4*perMessage + replyPriming + DefaultImageTokens
	if req.PromptTokens != want {
		t.Errorf("prompt tokens %d, want %d", req.PromptTokens, want)
	}
	// the base64 image must not be counted as text: 150 bytes of it
	// would add about 60 tokens
	if req.PromptTokens > want+5 {
		t.Errorf("the image data was counted")
	}
}

// TestParseChatIsCloseToTheProvider: a plain chat request's estimate is
// within 10% of what the provider bills (OpenAI's documented chat format
// over the real o200k_base tokenizer: 63 tokens).
func TestParseChatIsCloseToTheProvider(t *testing.T) {
	req, err := Parse(ChatCompletions, readRequest(t, "chat_plain.json"), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if off := float64(req.PromptTokens)/63 - 1; math.Abs(off) > 0.10 {
		t.Fatalf("estimated %d prompt tokens, the provider bills 63 (%+.0f%%)", req.PromptTokens, 100*off)
	}
	if req.MaxOutputTokens != 0 || req.Choices != 1 || req.Stream {
		t.Fatalf("%+v", req)
	}
}

func TestParseEscapesCountAsTheirText(t *testing.T) {
	plain := "Grüße,\n\t\"café\" — 模型 😀 done"
	esc, _ := json.Marshal(plain) // \n, \t, \" escaped; UTF-8 kept
	ascii := `"Gr\u00fc\u00dfe,\n\t\"caf\u00e9\" \u2014 \u6a21\u578b \ud83d\ude00 done"`
	for _, s := range []string{string(esc), ascii} {
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":` + s + `}]}`
		req, err := Parse(ChatCompletions, []byte(body), DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		want := Count(O200k, "user") + Count(O200k, plain) + perMessage + replyPriming
		if req.PromptTokens != want {
			t.Errorf("%s: %d tokens, want %d (the unescaped text's)", s, req.PromptTokens, want)
		}
	}
	req, err := Parse(ChatCompletions, []byte(`{"model":"gpt-\u0034o","messages":[]}`), DefaultLimits())
	if err != nil || req.Model != "gpt-4o" || req.Family != O200k {
		t.Fatalf("escaped model: %+v %v", req, err)
	}
}

// TestParseDecodesEscapedNames: a provider decodes escapes in member
// names, so `"m\u0065ssages"` is the messages and `"max_tok\u0065ns"` the
// output bound; a body spelling them so must estimate as the plain one,
// not as an empty request of one token. A bound named twice counts at its
// largest (providers keep the last one, which may be either).
func TestParseDecodesEscapedNames(t *testing.T) {
	text := strings.Repeat("many words to count here ", 400)
	plain := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":50000}`
	want, err := Parse(ChatCompletions, []byte(plain), DefaultLimits())
	if err != nil || want.PromptTokens < 1000 {
		t.Fatalf("plain: %+v %v", want, err)
	}
	for _, body := range []string{
		`{"model":"gpt-4o","m\u0065ssages":[{"role":"user","content":"` + text + `"}],"max_tok\u0065ns":50000}`,
		`{"model":"gpt-4o","messages":[{"r\u006fle":"user","\u0063ontent":"` + text + `"}],"max_tokens":50000}`,
		`{"model":"gpt-4o","max_tokens":50000,"messages":[{"role":"user","content":"` + text + `"}],"max_tokens":1}`,
		`{"model":"gpt-4o","max_tokens":1,"messages":[{"role":"user","content":"` + text + `"}],"max_tokens":50000}`,
	} {
		got, err := Parse(ChatCompletions, []byte(body), DefaultLimits())
		if err != nil || got.PromptTokens != want.PromptTokens || got.MaxOutputTokens != 50000 {
			t.Errorf("%.80s…: %d prompt tokens, max output %d (%v); want %d and 50000", body, got.PromptTokens, got.MaxOutputTokens, err, want.PromptTokens)
		}
	}
	if _, err := Parse(ChatCompletions, []byte(`{"model":"m","mess\u00":[]}`), DefaultLimits()); err == nil {
		t.Error("a bad escape in a name was accepted")
	}
}

func TestParseCompletionsAndEmbeddings(t *testing.T) {
	req, err := Parse(Completions, readRequest(t, "completions_ids.json"), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	// token ids count exactly: 4 + 3
	if req.PromptTokens != 7 || req.MaxOutputTokens != 16 || req.Choices != 3 || req.Family != Cl100k {
		t.Fatalf("token-id prompt: %+v", req)
	}
	for _, c := range []struct {
		prompt string
		want   int64
	}{
		{`"Say this is a test"`, Count(Cl100k, "Say this is a test")},
		{`["Say this", "is a test"]`, Count(Cl100k, "Say this") + Count(Cl100k, "is a test")},
		{`[1, 2, 3]`, 3},
		{`[]`, 0},
		{`null`, 0},
	} {
		req, err := Parse(Completions, []byte(`{"model":"gpt-3.5-turbo-instruct","prompt":`+c.prompt+`,"suffix":null}`), DefaultLimits())
		if err != nil || req.PromptTokens != c.want {
			t.Errorf("prompt %s: %d tokens (%v), want %d", c.prompt, req.PromptTokens, err, c.want)
		}
	}

	req, err = Parse(Embeddings, readRequest(t, "embeddings.json"), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	want := Count(Cl100k, "Sluice meters tokens per tenant.") + Count(Cl100k, "Quotas are enforced from Redis flags.") +
		Count(Cl100k, "Überprüfung der Abrechnung für März")
	if req.PromptTokens != want || req.Model != "text-embedding-3-small" || req.MaxOutputTokens != 0 {
		t.Fatalf("embeddings: %+v, want %d prompt tokens", req, want)
	}
}

func TestParseResponses(t *testing.T) {
	req, err := Parse(Responses, readRequest(t, "responses.json"), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	want := textTokens(O200k, "Answer as a senior SRE. Be specific.", "user",
		"Why does a fixed window limit let almost twice the limit through across a minute boundary, while a sliding window does not?") +
		perMessage + DefaultImageTokens
	if req.Model != "o4-mini" || req.MaxOutputTokens != 2048 || req.Images != 1 || req.PromptTokens != want {
		t.Fatalf("%+v, want %d prompt tokens", req, want)
	}
	req, err = Parse(Responses, []byte(`{"model":"gpt-4.1","input":"Tell me a three sentence bedtime story about a unicorn."}`), DefaultLimits())
	if err != nil || req.PromptTokens != Count(O200k, "Tell me a three sentence bedtime story about a unicorn.") {
		t.Fatalf("string input: %+v %v", req, err)
	}
}

// TestParseAnthropicMessages: Anthropic's system (a string or blocks),
// each message's text blocks and the tools count; an image block counts
// as an image, its base64 data and the ids of tool results not as text.
func TestParseAnthropicMessages(t *testing.T) {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,
	"system":[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}],
	"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}},
		{"type":"text","text":"What is in the picture?"}]},
		{"role":"assistant","content":"A cat."},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01A09q90qw90lq917835lq9","content":"42"}]}],
	"temperature":0.2}`)
	req, err := Parse(AnthropicMessages, body, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	fam := FamilyOf("claude-sonnet-4-5")
	want := textTokens(fam, "You are terse.", "user", "What is in the picture?", "assistant", "A cat.", "user", "42") +
		3*perMessage + replyPriming + DefaultImageTokens
	if req.MaxOutputTokens != 1024 || !req.Stream || req.Images != 1 || req.PromptTokens != want {
		t.Fatalf("%+v, want %d prompt tokens, max 1024, one image", req, want)
	}
	req, err = Parse(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","system":"Be brief.","messages":[],"max_tokens":5}`), DefaultLimits())
	if err != nil || req.PromptTokens != textTokens(FamilyOf("claude-haiku-4-5"), "Be brief.")+replyPriming {
		t.Fatalf("string system: %+v %v", req, err)
	}
}

// TestParseGeminiGenerateContent: Gemini's systemInstruction, each
// content's text parts (a function call's name and arguments too) and
// the tools count, in either of the JSON spellings Google's API reads; an
// inline image counts as an image, its base64 data and MIME type not as
// text; generationConfig.maxOutputTokens and candidateCount bound the
// output. Escaped names and a bound named twice are read as the provider
// reads them, so they cannot shrink the estimate (issue 30).
func TestParseGeminiGenerateContent(t *testing.T) {
	body := `{"systemInstruction":{"parts":[{"text":"You are terse."}]},
	"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}},
		{"text":"What is in the picture?"}]},
		{"role":"model","parts":[{"functionCall":{"name":"look","args":{"q":"cat"}},"thoughtSignature":"c2lnbmF0dXJl"}]}],
	"tools":[{"functionDeclarations":[{"name":"look","description":"Looks."}]}],
	"generationConfig":{"temperature":0.2,"maxOutputTokens":300,"candidateCount":2}}`
	fam := FamilyOf("")
	want := textTokens(fam, "You are terse.", "user", "What is in the picture?", "model", "look", "q", "cat") +
		2*perMessage + replyPriming + DefaultImageTokens + textTokens(fam, "functionDeclarations", "name", "look", "description", "Looks.")
	req, err := Parse(GeminiGenerateContent, []byte(body), DefaultLimits())
	if err != nil || req.MaxOutputTokens != 300 || req.Choices != 2 || req.Images != 1 || req.PromptTokens != want {
		t.Fatalf("%+v %v; want %d prompt tokens, max 300, 2 candidates, one image", req, err, want)
	}
	text := strings.Repeat("many words to count here ", 400)
	plain, err := Parse(GeminiGenerateContent, []byte(`{"contents":[{"role":"user","parts":[{"text":"`+text+`"}]}],"generationConfig":{"maxOutputTokens":50000}}`), DefaultLimits())
	if err != nil || plain.PromptTokens < 1000 || plain.MaxOutputTokens != 50000 {
		t.Fatalf("plain: %+v %v", plain, err)
	}
	for _, b := range []string{
		`{"cont\u0065nts":[{"role":"user","p\u0061rts":[{"t\u0065xt":"` + text + `"}]}],"generationConfig":{"maxOutputTok\u0065ns":50000}}`,
		`{"contents":[{"role":"user","parts":[{"text":"` + text + `"}]}],"generation_config":{"max_output_tokens":50000}}`,
		`{"contents":[{"role":"user","parts":[{"text":"` + text + `"}]}],"generationConfig":{"maxOutputTokens":50000,"maxOutputTokens":1}}`,
		`{"generationConfig":{"maxOutputTokens":1},"contents":[{"role":"user","parts":[{"text":"` + text + `"}]}],"generationConfig":{"maxOutputTokens":50000}}`,
	} {
		got, err := Parse(GeminiGenerateContent, []byte(b), DefaultLimits())
		if err != nil || got.PromptTokens != plain.PromptTokens || got.MaxOutputTokens != 50000 {
			t.Errorf("%.90s…: %d prompt tokens, max output %d (%v); want %d and 50000", b, got.PromptTokens, got.MaxOutputTokens, err, plain.PromptTokens)
		}
	}
}

// TestParseOnlyReadsTheEndpointsFields: the same key means nothing on
// another endpoint (a chat body's "input" is not its prompt).
func TestParseOnlyReadsTheEndpointsFields(t *testing.T) {
	body := []byte(`{"model":"gpt-4o","input":"a long text that is not a chat prompt at all","prompt":"nor this","max_tokens":5}`)
	req, err := Parse(ChatCompletions, body, DefaultLimits())
	if err != nil || req.PromptTokens != 0 || req.MaxOutputTokens != 5 {
		t.Fatalf("%+v %v", req, err)
	}
}

func TestParseRefusesWhatItCannotBound(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxBodyBytes = 100
	_, err := Parse(ChatCompletions, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"`+strings.Repeat("x", 100)+`"}]}`), lim)
	if !errors.Is(err, ErrBodyTooLarge) || !strings.Contains(err.Error(), "max_body_bytes is 100") {
		t.Fatalf("large body: %v", err)
	}
	deep := `{"model":"gpt-4o","messages":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`
	if _, err := Parse(ChatCompletions, []byte(deep), DefaultLimits()); err == nil || !strings.Contains(err.Error(), "deeper than 64") {
		t.Fatalf("deep body: %v", err)
	}
	for _, bad := range []string{
		``, `[]`, `{`, `{"model":}`, `{"model":"gpt-4o"`, `{"model":"gpt-4o"}x`, `{"model":"gpt-4o",}`,
		`{"messages":[{"content":"unterminated}]}`, `{"messages":[1 2]}`, `{"n":01x}`, `{"model":"a\q"}`,
		`{"messages":[{"content":"bad \u12"}]}`, "{\"messages\":[{\"content\":\"raw \x01 control\"}]}", `{"stream":tru}`, `{,}`,
	} {
		_, err := Parse(ChatCompletions, []byte(bad), DefaultLimits())
		if err == nil || !strings.HasPrefix(err.Error(), "estimate: invalid JSON at byte ") {
			t.Errorf("%q: %v, want an invalid JSON error naming the byte", bad, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"chat_tools.json", "chat_plain.json", "completions_ids.json", "embeddings.json", "responses.json", "gemini.json"} {
		f.Add(readRequest(f, name))
	}
	f.Add([]byte(`{"input":[[1,2],[3]],"prompt":"\ud83d\ude00"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range []Endpoint{ChatCompletions, Completions, Embeddings, Responses, AnthropicMessages, GeminiGenerateContent} {
			req, err := Parse(ep, body, DefaultLimits())
			if err == nil && (req.PromptTokens < 0 || req.Choices < 1 || req.Choices > MaxChoices || req.MaxOutputTokens < 0) {
				t.Fatalf("%v: %+v", ep, req)
			}
			// Every valid JSON object within the limits parses.
			if err != nil && json.Valid(body) && strings.HasPrefix(strings.TrimSpace(string(body)), "{") &&
				!strings.Contains(err.Error(), "deeper than") {
				t.Fatalf("%v: valid JSON refused: %v", ep, err)
			}
		}
	})
}

func TestCompletionFromTheRequestOrTheLearnedRatio(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	// max_completion_tokens × n, unpadded: the provider enforces it.
	est, err := e.Estimate("acme", ChatCompletions, readRequest(t, "chat_tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	if est.Source != SourceRequest || est.Completion != 800 || est.Prompt != ceil(float64(est.PromptTokens)*1.15) {
		t.Fatalf("%+v", est)
	}

	body := readRequest(t, "chat_plain.json")
	est, _ = e.Estimate("acme", ChatCompletions, body)
	p := float64(est.PromptTokens)
	if est.Source != SourceDefault || est.Completion != ceil(p*DefaultRatio*1.15) {
		t.Fatalf("before any settlement: %+v", est)
	}
	// Settled usage teaches the ratio: 0.1 of the way from the first
	// observation (which is taken whole) to each next one.
	e.Observe("acme", "gpt-4o-mini", 100, 300) // 3
	e.Observe("acme", "gpt-4o-mini", 100, 100) // 1: 3 + 0.1 × (1 − 3) = 2.8
	if r, ok := e.Ratio("acme", "gpt-4o-mini"); !ok || math.Abs(r-2.8) > 1e-9 {
		t.Fatalf("ratio %v %v, want 2.8", r, ok)
	}
	est, _ = e.Estimate("acme", ChatCompletions, body)
	if est.Source != SourceLearned || est.Completion != ceil(p*2.8*1.15) || est.Total() != est.Prompt+est.Completion {
		t.Fatalf("learned: %+v", est)
	}
	// Another tenant, or another model, has its own ratio.
	if est, _ := e.Estimate("globex", ChatCompletions, body); est.Source != SourceDefault {
		t.Fatalf("another tenant: %+v", est)
	}
	// One tiny prompt with a long answer is capped at MaxRatio, and a
	// learned completion at MaxCompletionTokens.
	e.Observe("globex", "gpt-4o-mini", 1, 4000)
	if r, _ := e.Ratio("globex", "gpt-4o-mini"); r != DefaultMaxRatio {
		t.Fatalf("uncapped ratio %v", r)
	}
	big := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("word ", 5000) + `"}]}`)
	if est, _ := e.Estimate("globex", ChatCompletions, big); est.Completion != ceil(DefaultMaxCompletionTokens*1.15) {
		t.Fatalf("completion %d not capped", est.Completion)
	}
	// Embeddings have no completion.
	if est, _ := e.Estimate("acme", Embeddings, readRequest(t, "embeddings.json")); est.Completion != 0 || est.Source != SourceNone {
		t.Fatalf("embeddings: %+v", est)
	}
	// Requests without a prompt or with a negative completion teach nothing.
	e.Observe("initech", "gpt-4o", 0, 10)
	e.Observe("initech", "gpt-4o", 10, -1)
	if _, ok := e.Ratio("initech", "gpt-4o"); ok {
		t.Fatal("learned from nothing")
	}
}

func TestNoMargin(t *testing.T) {
	e, err := New(Config{Margin: NoMargin})
	if err != nil {
		t.Fatal(err)
	}
	est, _ := e.Estimate("acme", ChatCompletions, readRequest(t, "chat_plain.json"))
	if est.Prompt != est.PromptTokens || est.Completion != est.PromptTokens {
		t.Fatalf("%+v", est)
	}
}

// TestRatiosAreBoundedAndKeepBusyPairs: memory stays at MaxKeys pairs
// whatever the number of tenant × model pairs, and the CLOCK eviction
// keeps a pair that is used between insertions while pairs used once go.
func TestRatiosAreBoundedAndKeepBusyPairs(t *testing.T) {
	e, err := New(Config{MaxKeys: 160})
	if err != nil {
		t.Fatal(err)
	}
	e.Observe("busy", "gpt-4o", 100, 50)
	e.Observe("once", "gpt-4o", 100, 50)
	for i := range 10_000 {
		e.Observe("t-"+strconv.Itoa(i), "gpt-4o", 100, 20)
		if _, ok := e.Ratio("busy", "gpt-4o"); !ok {
			t.Fatalf("the busy pair was evicted after %d new pairs", i+1)
		}
	}
	if n := e.Len(); n > 160 {
		t.Fatalf("%d pairs kept, MaxKeys is 160", n)
	}
	if _, ok := e.Ratio("once", "gpt-4o"); ok {
		t.Fatal("a pair used once survived 10,000 newer pairs")
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := New(Config{Margin: -0.5, Alpha: 2, MaxKeys: -1, DefaultRatio: 100, Limits: Limits{MaxBodyBytes: -1}})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"margin -0.5", "alpha 2", "max_keys -1", "default_ratio 100", "max_body_bytes -1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	e, err := New(Config{MaxKeys: 64})
	if err != nil {
		t.Fatal(err)
	}
	body := readRequest(t, "chat_tools.json")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				tenant := "t-" + strconv.Itoa((g*500+i)%200)
				if _, err := e.Estimate(tenant, ChatCompletions, body); err != nil {
					t.Error(err)
					return
				}
				e.Observe(tenant, "gpt-4o-2024-08-06", 100, int64(i))
			}
		}()
	}
	wg.Wait()
	if n := e.Len(); n > 64 {
		t.Fatalf("%d pairs, MaxKeys 64", n)
	}
}

func TestEndpointOf(t *testing.T) {
	for path, want := range map[string]Endpoint{
		"/v1/chat/completions": ChatCompletions, "/openai/deployments/gpt4o/chat/completions": ChatCompletions,
		"/v1/completions": Completions, "/v1/embeddings/": Embeddings, "/v1/responses": Responses,
		"/v1/messages": AnthropicMessages,
		"/v1beta/models/gemini-2.5-flash:generateContent": GeminiGenerateContent, "/v1beta/models/gemini-2.5-pro:streamGenerateContent": GeminiGenerateContent,
	} {
		if got, ok := EndpointOf(path); !ok || got != want {
			t.Errorf("EndpointOf(%q) = %v %v, want %v", path, got, ok, want)
		}
	}
	if _, ok := EndpointOf("/v1/models"); ok {
		t.Error("/v1/models has no prompt")
	}
}

// TestEstimatesSaturateInsteadOfOverflowing: bounds near 2^63 — a
// request's max_tokens of 9223372036854775807 times n, a prompt count a
// caller of Complete passes, a configured cap — give the largest figure,
// never one that wrapped around to a negative or tiny number (which
// admission would refuse as invalid or, worse, debit as 1), and Prompt +
// Completion (Total, what admission adds up) stays within int64.
func TestEstimatesSaturateInsteadOfOverflowing(t *testing.T) {
	e, err := New(Config{MaxCompletionTokens: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, est Estimate, minTotal int64) {
		t.Helper()
		if est.Prompt < 0 || est.Completion < 0 || est.Total() < minTotal || est.Prompt > math.MaxInt64-est.Completion {
			t.Errorf("%s: prompt %d + completion %d = %d, want both non-negative, a total of at least %d, and no overflow",
				name, est.Prompt, est.Completion, est.Total(), minTotal)
		}
	}
	for _, b := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775807}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775807,"n":128}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9223372036854775808,"n":2}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":99999999999999999999999999999}`,
	} {
		est, err := e.Estimate("acme", ChatCompletions, []byte(b))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		check(b, est, 1<<40)
	}
	for name, req := range map[string]Request{
		"max_tokens 2^63-1 × 2":     {Endpoint: ChatCompletions, PromptTokens: 10, MaxOutputTokens: math.MaxInt64, Choices: 2},
		"max_tokens 2^62 × 128":     {Endpoint: ChatCompletions, PromptTokens: 10, MaxOutputTokens: 1 << 62, Choices: 128},
		"max_tokens 2^63-1":         {Endpoint: ChatCompletions, PromptTokens: 1000, MaxOutputTokens: math.MaxInt64, Choices: 1},
		"prompt 2^63-1":             {Endpoint: ChatCompletions, PromptTokens: math.MaxInt64, Choices: 1},
		"prompt 2^63-1, max_tokens": {Endpoint: ChatCompletions, PromptTokens: math.MaxInt64, MaxOutputTokens: math.MaxInt64, Choices: 1},
		"embeddings prompt 2^63-1":  {Endpoint: Embeddings, PromptTokens: math.MaxInt64, Choices: 1},
	} {
		check(name, e.Complete("acme", req), 1<<40)
	}
	if got := (Estimate{Prompt: math.MaxInt64, Completion: 5}).Total(); got != math.MaxInt64 {
		t.Errorf("Total of 2^63-1 + 5 = %d, want it saturated at 2^63-1", got)
	}
	// An image cost no gateway could mean is refused, since images ×
	// image_tokens would overflow.
	if _, err := New(Config{Limits: Limits{ImageTokens: math.MaxInt64 / 2}}); err == nil || !strings.Contains(err.Error(), "image_tokens") {
		t.Errorf("image_tokens 2^62 accepted (%v)", err)
	}
}
