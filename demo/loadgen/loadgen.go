// Package loadgen drives the demo: several tenants on different plans send
// OpenAI-style chat completions through the reference gateway at their own
// pace, and it counts how each was answered (served, 429 quota or rate,
// 503 breaker), so the dashboard can show enforcement as a user feels it.
package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/sdk/go/periodic"
)

// Tenant is one simulated customer.
type Tenant struct {
	Name   string
	APIKey string
	Model  string
	// RequestsPerSecond is the pace; PromptChars and MaxTokens set the
	// tokens each request costs (about PromptChars/4 + MaxTokens).
	RequestsPerSecond float64
	PromptChars       int
	MaxTokens         int
	// Stream asks for a streaming response, to exercise metering of SSE.
	Stream bool
	// MaxInFlight bounds the tenant's requests waiting for an answer
	// (default 8); a tenant meant to overload an upstream needs more.
	MaxInFlight int
}

// Counts is how one tenant's requests were answered.
type Counts struct {
	Sent, OK, Quota429, Breaker503, Other atomic.Int64
	// Fallback counts the answers served by another model than the one
	// asked for (the gateway's X-Sluice-Served-Model).
	Fallback atomic.Int64
	// LastRefusal is the error message of the latest refusal, as a user sees it.
	lastRefusal atomic.Pointer[string]
	// started is when the first request was sent, in Unix nanoseconds
	// (0: none yet).
	started atomic.Int64
}

// Started returns when the tenant's first request was sent, zero before
// one was: the start the demo measures its first prediction from.
func (c *Counts) Started() time.Time {
	if ns := c.started.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// LastRefusal returns the body of the most recent 429/503 answer.
func (c *Counts) LastRefusal() string {
	if p := c.lastRefusal.Load(); p != nil {
		return *p
	}
	return ""
}

// Generator runs the tenants against a gateway URL.
type Generator struct {
	URL     string
	Tenants []Tenant
	Client  *http.Client

	mu     sync.Mutex
	counts map[string]*Counts
}

// Counts returns the live counters of a tenant.
func (g *Generator) Counts(tenant string) *Counts {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.counts == nil {
		g.counts = map[string]*Counts{}
	}
	c, ok := g.counts[tenant]
	if !ok {
		c = &Counts{}
		g.counts[tenant] = c
	}
	return c
}

// Run sends until ctx ends. Each tenant has one sender goroutine and at most
// a few requests in flight, so a slow gateway slows the load instead of
// piling up goroutines.
func (g *Generator) Run(ctx context.Context) error {
	if g.Client == nil {
		g.Client = &http.Client{Timeout: 10 * time.Second}
	}
	var wg sync.WaitGroup
	for _, t := range g.Tenants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.runTenant(ctx, t)
		}()
	}
	wg.Wait()
	return nil
}

const maxInFlightPerTenant = 8

func (g *Generator) runTenant(ctx context.Context, t Tenant) {
	if t.RequestsPerSecond <= 0 {
		return
	}
	counts := g.Counts(t.Name)
	body := requestBody(t)
	inflight := t.MaxInFlight
	if inflight <= 0 {
		inflight = maxInFlightPerTenant
	}
	slots := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	defer wg.Wait()
	periodic.Every(ctx, time.Duration(float64(time.Second)/t.RequestsPerSecond), func() {
		select {
		case slots <- struct{}{}:
		default:
			return // the gateway is slower than our pace: skip this tick
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			g.send(ctx, t, body, counts)
		}()
	})
}

// RequestBody is the chat completion body the generator sends for t (the
// demo's tests estimate the demo's load from it).
func RequestBody(t Tenant) []byte { return requestBody(t) }

func requestBody(t Tenant) []byte {
	prompt := strings.Repeat("lorem ipsum ", t.PromptChars/12+1)[:t.PromptChars]
	return fmt.Appendf(nil, `{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`,
		t.Model, t.MaxTokens, t.Stream, prompt)
}

func (g *Generator) send(ctx context.Context, t Tenant, body []byte, c *Counts) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+t.APIKey)
	c.Sent.Add(1)
	c.started.CompareAndSwap(0, time.Now().UnixNano())
	resp, err := g.Client.Do(req)
	if err != nil {
		c.Other.Add(1)
		return
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode == http.StatusOK:
		c.OK.Add(1)
		if m := resp.Header.Get("X-Sluice-Served-Model"); m != "" && m != t.Model {
			c.Fallback.Add(1)
		}
	case resp.StatusCode == http.StatusTooManyRequests:
		c.Quota429.Add(1)
		s := string(msg)
		c.lastRefusal.Store(&s)
	case resp.StatusCode == http.StatusServiceUnavailable:
		c.Breaker503.Add(1)
		s := string(msg)
		c.lastRefusal.Store(&s)
	default:
		c.Other.Add(1)
	}
}
