package gateway

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path"
	"reflect"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/policy"
)

// provider is one upstream of the policy (policy.Upstream), ready to call:
// its credential read and its HTTP client built.
type provider struct {
	cfg     policy.Upstream
	key     string // the provider's API key; empty for none
	client  *http.Client
	catalog catalog // the upstream's own model list, for /v1/models
}

func newProvider(u policy.Upstream) (*provider, error) {
	key, err := frontend.Secret("api_key_env", u.APIKeyEnv, "api_key_file", u.APIKeyFile)
	if err != nil {
		return nil, fmt.Errorf("upstreams.%s.%w", u.Name, err)
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
	return &provider{cfg: u, key: key, client: &http.Client{Transport: tr}}, nil
}

// url is where to send a call of operation suffix (/chat/completions)
// for model: under the base URL, for an azure upstream under the model's
// deployment with the upstream's api-version, for a gemini one under the
// model (suffix is then the method, :generateContent).
func (p *provider) url(suffix, model string) string {
	switch p.cfg.Dialect {
	case policy.DialectGemini:
		return geminiURL(p.cfg.BaseURL, model, suffix)
	case policy.DialectAzure:
	default:
		return p.cfg.BaseURL + suffix
	}
	dep := p.cfg.Deployments[model]
	if dep == "" {
		dep = model
	}
	return p.cfg.BaseURL + "/deployments/" + url.PathEscape(dep) + suffix + "?api-version=" + url.QueryEscape(p.cfg.APIVersion)
}

// routes maps a model to the upstreams that serve it, in each dialect:
// a request is routed only to upstreams that speak its route's API.
type routes struct {
	byName    map[string]*provider
	byDialect map[string]*modelRoutes
}

// modelRoutes are the routes of one dialect.
type modelRoutes struct {
	exact    map[string][]*provider
	patterns []patternRoute
}

type patternRoute struct {
	pattern string
	ups     []*provider
}

// newRoutes builds the routes of p's upstreams. An upstream whose entry
// is the same as in old keeps its provider (its connections); one whose
// credential cannot be read keeps old's provider, or is left out, and is
// reported in the error.
func newRoutes(p *policy.Policy, old *routes) (*routes, error) {
	r := &routes{byName: map[string]*provider{}, byDialect: map[string]*modelRoutes{}}
	var errs []error
	for _, name := range p.UpstreamNames() {
		u, _ := p.Upstream(name)
		prev := old.provider(name)
		if prev != nil && reflect.DeepEqual(prev.cfg, u) {
			r.add(prev)
			continue
		}
		pv, err := newProvider(u)
		if err != nil {
			errs = append(errs, err)
			if prev != nil {
				r.add(prev)
			}
			continue
		}
		r.add(pv)
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("%d upstream(s) not (re)built: %v", len(errs), errs)
	}
	return r, nil
}

func (r *routes) add(pv *provider) {
	r.byName[pv.cfg.Name] = pv
	dialect := pv.cfg.Dialect
	if dialect == policy.DialectAzure {
		dialect = policy.DialectOpenAI // OpenAI's API under other URLs
	}
	d := r.byDialect[dialect]
	if d == nil {
		d = &modelRoutes{exact: map[string][]*provider{}}
		r.byDialect[dialect] = d
	}
	for _, m := range pv.cfg.Models {
		if !strings.ContainsAny(m, `*?[\`) {
			d.exact[m] = append(d.exact[m], pv)
			continue
		}
		i := 0
		for i < len(d.patterns) && d.patterns[i].pattern != m {
			i++
		}
		if i == len(d.patterns) {
			d.patterns = append(d.patterns, patternRoute{pattern: m})
		}
		d.patterns[i].ups = append(d.patterns[i].ups, pv)
	}
}

// provider returns the upstream called name, nil for none (or a nil r).
func (r *routes) provider(name string) *provider {
	if r == nil {
		return nil
	}
	return r.byName[name]
}

// lookup returns the upstreams of dialect serving model and the route's
// name (the model for an exact route, the pattern otherwise), which
// labels metrics without letting callers invent label values. An exact
// route wins; among patterns, the first listed that matches. The empty
// dialect is OpenAI's, the policy's default.
func (r *routes) lookup(dialect, model string) ([]*provider, string) {
	if dialect == "" {
		dialect = policy.DialectOpenAI
	}
	d := r.byDialect[dialect]
	if d == nil {
		return nil, ""
	}
	if ups, ok := d.exact[model]; ok {
		return ups, model
	}
	for _, p := range d.patterns {
		if ok, _ := path.Match(p.pattern, model); ok {
			return p.ups, p.pattern
		}
	}
	return nil, ""
}

// exactModels lists the models named exactly by some upstream of
// OpenAI's dialect (what GET /v1/models lists).
func (r *routes) exactModels() []string {
	d := r.byDialect[policy.DialectOpenAI]
	if d == nil {
		return nil
	}
	out := make([]string, 0, len(d.exact))
	for m := range d.exact {
		out = append(out, m)
	}
	return out
}

// order returns up to n upstreams to try, in order: those whose breaker
// is not open first (broken reports it), each drawn at random in
// proportion to its weight, so load balances by weight and a failover goes
// elsewhere; then those whose breaker is open, as a last resort.
func order(ups []*provider, n int, broken func(*provider) bool) []*provider {
	if len(ups) == 1 {
		return ups
	}
	healthy := make([]*provider, 0, len(ups))
	var down []*provider
	for _, u := range ups {
		if broken(u) {
			down = append(down, u)
		} else {
			healthy = append(healthy, u)
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
