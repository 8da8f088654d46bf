package gateway

import (
	"math/rand/v2"
	"net"
	"net/http"
	"path"
	"strings"
	"sync/atomic"
	"time"
)

// upstream is one configured provider, ready to call.
type provider struct {
	cfg    Upstream
	base   string // base URL without a trailing slash
	key    string // the provider's API key; empty for none
	client *http.Client

	// Passive health: after failThreshold failures in a row the upstream
	// is tried last for coolDown, so one dead provider does not cost every
	// request a failed attempt first.
	fails     atomic.Int32
	downUntil atomic.Int64 // unix ns
}

const (
	failThreshold = 3
	coolDown      = 10 * time.Second
)

func newProvider(u Upstream) (*provider, error) {
	u = u.withDefaults()
	key, err := u.credential()
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: u.ConnectTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   u.ConnectTimeout,
		ResponseHeaderTimeout: u.ResponseHeaderTimeout,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		// The gateway meters what the provider sends; it must see the
		// body as sent, not ask for a compression it would then undo.
		DisableCompression: true,
	}
	return &provider{cfg: u, base: strings.TrimRight(u.BaseURL, "/"), key: key, client: &http.Client{Transport: tr}}, nil
}

func (u *provider) healthy(now time.Time) bool { return now.UnixNano() >= u.downUntil.Load() }

// succeeded and failed feed the passive health.
func (u *provider) succeeded() { u.fails.Store(0) }

func (u *provider) failed(now time.Time) {
	if u.fails.Add(1) >= failThreshold {
		u.downUntil.Store(now.Add(coolDown).UnixNano())
		u.fails.Store(0)
	}
}

// routes maps a model to the upstreams that serve it.
type routes struct {
	exact    map[string][]*provider
	patterns []patternRoute
	all      []*provider
}

type patternRoute struct {
	pattern string
	ups     []*provider
}

func newRoutes(ups []*provider) *routes {
	r := &routes{exact: map[string][]*provider{}, all: ups}
	byPattern := map[string]int{}
	for _, u := range ups {
		for _, m := range u.cfg.Models {
			if !strings.ContainsAny(m, `*?[\`) {
				r.exact[m] = append(r.exact[m], u)
				continue
			}
			i, ok := byPattern[m]
			if !ok {
				i = len(r.patterns)
				byPattern[m] = i
				r.patterns = append(r.patterns, patternRoute{pattern: m})
			}
			r.patterns[i].ups = append(r.patterns[i].ups, u)
		}
	}
	return r
}

// lookup returns the upstreams serving model and the route's name (the
// model for an exact route, the pattern otherwise), which labels metrics
// without letting callers invent label values. An exact route wins; among
// patterns, the first listed that matches.
func (r *routes) lookup(model string) ([]*provider, string) {
	if ups, ok := r.exact[model]; ok {
		return ups, model
	}
	for _, p := range r.patterns {
		if ok, _ := path.Match(p.pattern, model); ok {
			return p.ups, p.pattern
		}
	}
	return nil, ""
}

// exactModels lists the models named exactly by some upstream.
func (r *routes) exactModels() []string {
	out := make([]string, 0, len(r.exact))
	for m := range r.exact {
		out = append(out, m)
	}
	return out
}

// order returns up to n upstreams to try, in order: the healthy ones
// first, each drawn at random in proportion to its weight (so load
// balances by weight and a failover goes elsewhere), then those cooling
// down after failures, as a last resort.
func order(ups []*provider, n int, now time.Time) []*provider {
	if len(ups) == 1 {
		return ups
	}
	healthy := make([]*provider, 0, len(ups))
	var down []*provider
	for _, u := range ups {
		if u.healthy(now) {
			healthy = append(healthy, u)
		} else {
			down = append(down, u)
		}
	}
	out := make([]*provider, 0, min(n, len(ups)))
	for len(healthy) > 0 && len(out) < n {
		total := 0
		for _, u := range healthy {
			total += u.cfg.Weight
		}
		x := rand.IntN(total)
		for i, u := range healthy {
			if x -= u.cfg.Weight; x < 0 {
				out = append(out, u)
				healthy = append(healthy[:i], healthy[i+1:]...)
				break
			}
		}
	}
	for _, u := range down {
		if len(out) < n {
			out = append(out, u)
		}
	}
	return out
}
