// Package estimate says, before an LLM call, how many tokens it will use,
// so that a gateway can debit an estimate first and settle it with the
// real usage afterwards (the usage event's `estimated` field; admission
// debits the same figure).
//
// The prompt is counted from the OpenAI-style request body — chat
// completions messages with their content parts and tools, a completions
// prompt (strings or token ids), embeddings input, Responses input and
// instructions — by Parse, in one pass without reflection, allocating
// only the model name, with a body size and nesting limit.
//
// # Counting: an estimate, not a tokenizer
//
// Count is a character-class estimate per model family (o200k for gpt-4o,
// gpt-4.1, gpt-5 and the o-series; cl100k for gpt-4, gpt-3.5 and the
// embedding models; cl100k's weights for every other model), not OpenAI's
// tokenizer. A faithful pure-Go tokenizer that works offline does exist in
// the Go module proxy (github.com/tiktoken-go/tokenizer, which embeds the
// vocabularies); measured on the 2-core reference machine it reads about
// 3.5 MB/s (3 ms for a 10 KB prompt, 30 ms for 100 KB), 30 to 45 times
// slower than Count on the same text, takes 60 ms and 7 MB of heap to load
// each vocabulary on first use and adds 12 MB to every gateway binary: a
// long prompt alone would exceed the whole admission budget on the
// request path (5 ms). Count reads each byte once with a table lookup and
// allocates nothing (BenchmarkCount), and an estimate only stands until
// the call settles with the provider's own count. Its weights were fitted
// against that tokenizer: on the corpus in testdata (prose, chat, code,
// JSON, logs, Chinese, Japanese, Russian, German and Spanish) the total is
// within 3% of the real count for both families and each text within 22%
// (TestCountMatchesTheTokenizers); on 34 held-out files (licences, Go,
// Python, JSON, READMEs) within 2% in total and each within 15%. The
// worst cases are dense JSON (counted about 20% high) and accented
// European text under cl100k (about 15% low); the margin covers the
// usual error.
//
// # Completion
//
// The completion is the request's own bound when it gives one
// (max_completion_tokens, max_tokens, max_output_tokens, times n), which
// the provider enforces. Otherwise it is the prompt times a completion
// ratio learned per tenant × model from settled usage (Observe): an
// exponentially weighted average of completion ÷ prompt tokens, the first
// observation taken whole, each later one moving it Config.Alpha (0.1) of
// the way, each capped at Config.MaxRatio (32); before any observation
// Config.DefaultRatio (1). A learned or default completion is capped at
// Config.MaxCompletionTokens (32,768) and not multiplied by n, which the
// observed ratio already includes. Learned and default completions, and
// the prompt, are padded by Config.Margin (15% by default); a request's
// own bound is not, since nothing can exceed it. Embeddings have no
// completion. Every figure saturates instead of overflowing, and Prompt +
// Completion stays within int64: a max_tokens near 2^63 estimates as the
// largest count, which any limit refuses, never as a wrapped-around
// small one.
//
// # Memory
//
// The ratios are kept for at most Config.MaxKeys tenant × model pairs,
// about 120 bytes each with a 13-byte tenant and an 11-byte model name
// (measured: 100,000 pairs, 11.9 MB). The pairs are spread over 16 locked
// shards of MaxKeys/16 each, so one shard may start evicting a little
// before the whole is full. When a shard is full, a new pair evicts one
// that has not been used since the eviction hand last passed it (CLOCK,
// an approximation of least recently used, with new pairs entering
// unreferenced so that one-off pairs go first): busy pairs keep their
// ratio, an evicted pair starts again from Config.DefaultRatio.
package estimate

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"sync"
)

// Config configures an Estimator. The zero value of a field means its
// default (DefaultConfig).
type Config struct {
	// Limits bound what the body parser reads.
	Limits Limits
	// Margin pads the counted prompt and a learned or default completion:
	// 0.15 debits 15% more than counted. 0 means the default; use
	// NoMargin for none.
	Margin float64
	// DefaultRatio is the completion ÷ prompt ratio of a tenant × model
	// without settled usage yet.
	DefaultRatio float64
	// Alpha is the weight of each new observation in the learned ratio
	// (0 < Alpha ≤ 1): about the last 1/Alpha requests count.
	Alpha float64
	// MaxRatio caps an observed ratio before it is learned, so that one
	// tiny prompt with a long answer cannot make the next long prompt's
	// estimate absurd.
	MaxRatio float64
	// MaxCompletionTokens caps a learned or default completion per
	// request (a request's own max_tokens is not capped).
	MaxCompletionTokens int64
	// MaxKeys is the most tenant × model ratios kept.
	MaxKeys int
}

// NoMargin as Config.Margin pads nothing.
const NoMargin = -1

// Defaults for Config.
const (
	DefaultMargin              = 0.15
	DefaultRatio               = 1.0
	DefaultAlpha               = 0.1
	DefaultMaxRatio            = 32.0
	DefaultMaxCompletionTokens = 32_768
	DefaultMaxKeys             = 100_000
)

// MaxImageTokens bounds Limits.ImageTokens: with the images a body can
// hold, images × ImageTokens then stays far within int64.
const MaxImageTokens = 1 << 20

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Limits: DefaultLimits(), Margin: DefaultMargin, DefaultRatio: DefaultRatio, Alpha: DefaultAlpha,
		MaxRatio: DefaultMaxRatio, MaxCompletionTokens: DefaultMaxCompletionTokens, MaxKeys: DefaultMaxKeys}
}

func (c *Config) fill() error {
	d := DefaultConfig()
	c.Limits.MaxBodyBytes = cmp.Or(c.Limits.MaxBodyBytes, d.Limits.MaxBodyBytes)
	c.Limits.MaxDepth = cmp.Or(c.Limits.MaxDepth, d.Limits.MaxDepth)
	c.Limits.ImageTokens = cmp.Or(c.Limits.ImageTokens, d.Limits.ImageTokens)
	switch {
	case c.Margin == 0:
		c.Margin = d.Margin
	case c.Margin == NoMargin:
		c.Margin = 0
	}
	c.DefaultRatio = cmp.Or(c.DefaultRatio, d.DefaultRatio)
	c.Alpha = cmp.Or(c.Alpha, d.Alpha)
	c.MaxRatio = cmp.Or(c.MaxRatio, d.MaxRatio)
	c.MaxCompletionTokens = cmp.Or(c.MaxCompletionTokens, d.MaxCompletionTokens)
	c.MaxKeys = cmp.Or(c.MaxKeys, d.MaxKeys)
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("estimate: "+format, args...))
		}
	}
	check(c.Limits.MaxBodyBytes > 0, "max_body_bytes %d must be positive", c.Limits.MaxBodyBytes)
	check(c.Limits.MaxDepth > 0 && c.Limits.MaxDepth <= 1000, "max_depth %d must be 1 to 1000", c.Limits.MaxDepth)
	check(c.Limits.ImageTokens > 0 && c.Limits.ImageTokens <= MaxImageTokens, "image_tokens %d must be 1 to %d", c.Limits.ImageTokens, MaxImageTokens)
	check(c.Margin >= 0 && c.Margin <= 10, "margin %g must be 0 to 10 (NoMargin for none)", c.Margin)
	check(c.DefaultRatio > 0 && c.DefaultRatio <= c.MaxRatio, "default_ratio %g must be above 0 and at most max_ratio %g", c.DefaultRatio, c.MaxRatio)
	check(c.Alpha > 0 && c.Alpha <= 1, "alpha %g must be above 0 and at most 1", c.Alpha)
	check(c.MaxCompletionTokens > 0, "max_completion_tokens %d must be positive", c.MaxCompletionTokens)
	check(c.MaxKeys > 0, "max_keys %d must be positive", c.MaxKeys)
	return errors.Join(errs...)
}

// Source says where an estimate's completion comes from.
type Source uint8

// The completion sources.
const (
	// SourceNone: the endpoint has no completion (embeddings).
	SourceNone Source = iota
	// SourceRequest: the request's own max_completion_tokens, max_tokens
	// or max_output_tokens, times its choices.
	SourceRequest
	// SourceLearned: the tenant × model's learned ratio.
	SourceLearned
	// SourceDefault: Config.DefaultRatio, nothing learned yet.
	SourceDefault
)

// String names the source as usage events and logs show it.
func (s Source) String() string {
	switch s {
	case SourceRequest:
		return "request"
	case SourceLearned:
		return "learned"
	case SourceDefault:
		return "default"
	}
	return "none"
}

// Estimate is what a request is expected to use. Its figures saturate
// instead of overflowing: a bound near 2^63 (max_tokens of
// 9223372036854775807 times n) gives the largest figure, so that any
// limit refuses it, and Prompt + Completion never exceeds math.MaxInt64
// (Completion gives way), so that a caller adding them — Total,
// admission — cannot wrap around to a small debit.
type Estimate struct {
	// Request is what the body says, with the counted prompt.
	Request
	// Prompt is the counted prompt padded by the margin.
	Prompt int64
	// Completion is the expected completion (see Source).
	Completion int64
	// Source says where Completion comes from.
	Source Source
}

// Total is Prompt + Completion, the figure to debit, saturated at
// math.MaxInt64 (an Estimate built elsewhere may exceed it).
func (e Estimate) Total() int64 { return addSat(e.Prompt, e.Completion) }

// Estimator estimates requests and learns completion ratios. It is safe
// for concurrent use.
type Estimator struct {
	cfg    Config
	seed   maphash.Seed
	shards [ratioShards]ratioShard
}

// New returns an Estimator; an invalid cfg is an error naming each field
// and its limit.
func New(cfg Config) (*Estimator, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	e := &Estimator{cfg: cfg, seed: maphash.MakeSeed()}
	per := max(1, (cfg.MaxKeys+ratioShards-1)/ratioShards)
	for i := range e.shards {
		e.shards[i].max = per
		e.shards[i].index = make(map[ratioKey]int32)
	}
	return e, nil
}

// Config returns the configuration in force, defaults filled in.
func (e *Estimator) Config() Config { return e.cfg }

// Estimate parses body (a request to ep) and estimates it for tenant.
func (e *Estimator) Estimate(tenant string, ep Endpoint, body []byte) (Estimate, error) {
	req, err := Parse(ep, body, e.cfg.Limits)
	if err != nil {
		return Estimate{}, err
	}
	return e.Complete(tenant, req), nil
}

// Complete turns a parsed request into an estimate: the margin on the
// prompt and the completion from the request's bound or tenant × model's
// ratio. A request built by hand rather than by Parse may carry any
// figures: negative ones count as 0, and the arithmetic saturates (see
// Estimate).
func (e *Estimator) Complete(tenant string, req Request) Estimate {
	m := 1 + e.cfg.Margin
	est := Estimate{Request: req, Prompt: ceil(float64(req.PromptTokens) * m)}
	switch {
	case req.Endpoint == Embeddings:
	case req.MaxOutputTokens > 0:
		est.Completion, est.Source = mulSat(req.MaxOutputTokens, max(1, req.Choices)), SourceRequest
	default:
		ratio, learned := e.Ratio(tenant, req.Model)
		est.Source = SourceDefault
		if learned {
			est.Source = SourceLearned
		}
		c := min(float64(req.PromptTokens)*ratio, float64(e.cfg.MaxCompletionTokens))
		est.Completion = ceil(c * m)
	}
	est.Completion = min(est.Completion, math.MaxInt64-est.Prompt)
	return est
}

// ceil rounds a non-negative figure up to a count, 0 for a negative one
// and math.MaxInt64 for one beyond it (converting such a float to int64
// is undefined in Go and gives math.MinInt64 on amd64).
func ceil(x float64) int64 {
	c := math.Ceil(x - 1e-9)
	switch {
	case !(c > 0): // also NaN
		return 0
	case c >= math.MaxInt64: // float64(math.MaxInt64) is 2^63
		return math.MaxInt64
	}
	return int64(c)
}

// addSat is a + b saturated at the bounds of int64.
func addSat(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

// mulSat is a × b for positive counts, saturated at math.MaxInt64.
func mulSat(a, b int64) int64 {
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// Observe learns from one settled request of tenant on model: the ratio of
// its completion to its prompt tokens moves Alpha of the way towards this
// request's (capped at MaxRatio). Requests without prompt tokens teach
// nothing. Call it with the provider's usage of calls that succeeded.
func (e *Estimator) Observe(tenant, model string, promptTokens, completionTokens int64) {
	if promptTokens <= 0 || completionTokens < 0 || tenant == "" || model == "" {
		return
	}
	x := min(float64(completionTokens)/float64(promptTokens), e.cfg.MaxRatio)
	k := ratioKey{tenant, model}
	s := e.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.touch(k); r != nil {
		r.ratio += e.cfg.Alpha * (x - r.ratio)
		return
	}
	s.insert(k, x)
}

// Ratio returns tenant × model's learned completion ratio, or
// DefaultRatio and false when nothing was learned (or it was evicted).
func (e *Estimator) Ratio(tenant, model string) (float64, bool) {
	k := ratioKey{tenant, model}
	s := e.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.touch(k); r != nil {
		return r.ratio, true
	}
	return e.cfg.DefaultRatio, false
}

// Len returns the number of tenant × model ratios kept.
func (e *Estimator) Len() int {
	n := 0
	for i := range e.shards {
		s := &e.shards[i]
		s.mu.Lock()
		n += len(s.index)
		s.mu.Unlock()
	}
	return n
}

// ratioShards spreads the ratios over locks so that concurrent requests of
// different tenants rarely wait for each other.
const ratioShards = 16

type ratioKey struct{ tenant, model string }

type ratioEntry struct {
	key   ratioKey
	ratio float64
	used  bool // referenced since the clock hand last passed
}

type ratioShard struct {
	mu    sync.Mutex
	index map[ratioKey]int32
	ring  []ratioEntry
	hand  int
	max   int
}

func (e *Estimator) shard(k ratioKey) *ratioShard {
	var h maphash.Hash
	h.SetSeed(e.seed)
	h.WriteString(k.tenant)
	h.WriteByte(0)
	h.WriteString(k.model)
	return &e.shards[h.Sum64()%ratioShards]
}

// touch returns k's entry with its used bit set, so that the CLOCK hand
// spares a pair that is read or observed again, or nil when k is not kept.
// The caller holds s.mu.
func (s *ratioShard) touch(k ratioKey) *ratioEntry {
	i, ok := s.index[k]
	if !ok {
		return nil
	}
	r := &s.ring[i]
	r.used = true
	return r
}

// insert adds k with its first observation, evicting by CLOCK when full:
// the hand clears the used bit of each entry it passes and evicts the
// first one found without it. A new entry starts without the bit, so a
// pair seen once goes before any pair used again since the hand last
// passed it. The names are cloned, since callers may pass strings that
// share a request's memory.
func (s *ratioShard) insert(k ratioKey, ratio float64) {
	k = ratioKey{strings.Clone(k.tenant), strings.Clone(k.model)}
	if len(s.ring) < s.max {
		s.index[k] = int32(len(s.ring))
		s.ring = append(s.ring, ratioEntry{key: k, ratio: ratio})
		return
	}
	for {
		r := &s.ring[s.hand]
		if r.used {
			r.used = false
			s.hand = (s.hand + 1) % len(s.ring)
			continue
		}
		delete(s.index, r.key)
		*r = ratioEntry{key: k, ratio: ratio}
		s.index[k] = int32(s.hand)
		s.hand = (s.hand + 1) % len(s.ring)
		return
	}
}
