package authz

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The proxies' examples in deploy/ and the page that explains them must
// name what the endpoint reads and answers with its defaults: a user who
// copies them gets a working pair. nginx's file is also run by
// TestNginxForwardAuth; Envoy and Traefik are not in the test set, so
// their files are checked against the defaults here.

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDocsShowTheTestedNginxConfiguration: docs/forward-auth.md shows the
// nginx file the test runs, unchanged.
func TestDocsShowTheTestedNginxConfiguration(t *testing.T) {
	doc := readFile(t, "../../docs/forward-auth.md")
	if !strings.Contains(doc, "```nginx\n"+readFile(t, snippetFile)+"```") {
		t.Fatalf("docs/forward-auth.md does not show %s verbatim in an ```nginx block; paste the file again", snippetFile)
	}
}

// httpFilter is what the test reads of one of Envoy's HTTP filters.
type httpFilter struct {
	Name        string `yaml:"name"`
	TypedConfig struct {
		AllowedHeaders matcher `yaml:"allowed_headers"`
		HTTPService    struct {
			ServerURI struct {
				URI string `yaml:"uri"`
			} `yaml:"server_uri"`
			PathPrefix string `yaml:"path_prefix"`
			Response   struct {
				Upstream  matcher `yaml:"allowed_upstream_headers"`
				OnSuccess matcher `yaml:"allowed_client_headers_on_success"`
				Client    matcher `yaml:"allowed_client_headers"`
			} `yaml:"authorization_response"`
		} `yaml:"http_service"`
	} `yaml:"typed_config"`
}

func TestEnvoyExampleMatchesTheDefaults(t *testing.T) {
	var doc struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						TypedConfig struct {
							HTTPFilters []httpFilter `yaml:"http_filters"`
						} `yaml:"typed_config"`
					} `yaml:"filters"`
				} `yaml:"filter_chains"`
			} `yaml:"listeners"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "../../deploy/envoy/sluice-ext-authz.yaml")), &doc); err != nil {
		t.Fatal(err)
	}
	filters := doc.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.HTTPFilters
	i := slices.IndexFunc(filters, func(f httpFilter) bool { return f.Name == "envoy.filters.http.ext_authz" })
	if i < 0 {
		t.Fatal("no ext_authz filter")
	}
	f := filters[i]
	c, d := f.TypedConfig, DefaultConfig()
	if c.HTTPService.PathPrefix != d.Path || !strings.HasSuffix(c.HTTPService.ServerURI.URI, ":"+port(t, d.Listen)) {
		t.Errorf("Envoy asks %s%s; the endpoint's defaults are port %s, path %s", c.HTTPService.ServerURI.URI, c.HTTPService.PathPrefix, port(t, d.Listen), d.Path)
	}
	// Authorization goes to the check whatever the list says.
	c.AllowedHeaders.need(t, "allowed_headers", d.Headers.Model, d.Headers.Priority, d.Headers.EstimatePromptTokens, d.Headers.EstimateCompletionTokens)
	c.HTTPService.Response.Upstream.need(t, "allowed_upstream_headers", d.Headers.Tenant, d.Headers.KeyID)
	c.HTTPService.Response.OnSuccess.need(t, "allowed_client_headers_on_success", "x-ratelimit-limit-tokens", "x-ratelimit-reset-requests")
	c.HTTPService.Response.Client.need(t, "allowed_client_headers", "Retry-After", "Content-Type", "x-ratelimit-remaining-requests")
}

func TestTraefikExampleMatchesTheDefaults(t *testing.T) {
	var doc struct {
		HTTP struct {
			Middlewares map[string]struct {
				ForwardAuth struct {
					Address             string   `yaml:"address"`
					AuthRequestHeaders  []string `yaml:"authRequestHeaders"`
					AuthResponseHeaders []string `yaml:"authResponseHeaders"`
				} `yaml:"forwardAuth"`
			} `yaml:"middlewares"`
		} `yaml:"http"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "../../deploy/traefik/sluice-forward-auth.yml")), &doc); err != nil {
		t.Fatal(err)
	}
	fa, d := doc.HTTP.Middlewares["sluice"].ForwardAuth, DefaultConfig()
	if !strings.HasSuffix(fa.Address, ":"+port(t, d.Listen)+d.Path) {
		t.Errorf("Traefik asks %s; the endpoint's defaults are port %s, path %s", fa.Address, port(t, d.Listen), d.Path)
	}
	for _, h := range []string{d.Headers.Key, d.Headers.Model, d.Headers.Priority, d.Headers.EstimatePromptTokens, d.Headers.EstimateCompletionTokens} {
		if !slices.ContainsFunc(fa.AuthRequestHeaders, func(s string) bool { return strings.EqualFold(s, h) }) {
			t.Errorf("authRequestHeaders lacks %s, which the endpoint reads", h)
		}
	}
	for _, h := range []string{d.Headers.Tenant, d.Headers.KeyID} {
		if !slices.ContainsFunc(fa.AuthResponseHeaders, func(s string) bool { return strings.EqualFold(s, h) }) {
			t.Errorf("authResponseHeaders lacks %s, which the endpoint answers", h)
		}
	}
}

// matcher is Envoy's ListStringMatcher, exact and prefix patterns.
type matcher struct {
	Patterns []pattern `yaml:"patterns"`
}

type pattern struct {
	Exact  string `yaml:"exact"`
	Prefix string `yaml:"prefix"`
}

// need checks that every header matches a pattern; Envoy compares header
// names in lower case.
func (m matcher) need(t *testing.T, field string, headers ...string) {
	t.Helper()
	for _, h := range headers {
		h = strings.ToLower(h)
		if !slices.ContainsFunc(m.Patterns, func(p pattern) bool { return p.Exact == h || p.Prefix != "" && strings.HasPrefix(h, p.Prefix) }) {
			t.Errorf("Envoy's %s does not match %s", field, h)
		}
	}
}

func port(t *testing.T, hostport string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
