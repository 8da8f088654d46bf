package console

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/sluicehq/sluice/platform/httpserver"
)

// Config is the console's section of the configuration (services.console).
type Config struct {
	Listen      string              `yaml:"listen" help:"address of the web console (its own listener; the console runs only when named: sluice run ... console, or sluice demo)"`
	AdminURL    string              `yaml:"admin_url" help:"the enforcer's admin API, through which every console action (trip, reset, blacklist, override; issue, rotate, revoke API keys) goes, authenticated by the operator's admin token and audited there"`
	AdminCAFile string              `yaml:"admin_ca_file" help:"PEM CA certificate(s) to trust for an https admin_url with a private certificate"`
	FollowAdmin bool                `yaml:"follow_admin" help:"follow the admin topic (topics.admin) for the tenants and plans managed through the enforcer's admin API, laid over policy.file for the quota tables: a tenant without use yet shows the quotas in force, its record's; needs kafka and signal_auth. Off: policy.file's quotas only"`
	MetricsURLs []string            `yaml:"metrics_urls" help:"Prometheus /metrics endpoints of the services the pipeline page reads (ingest, aggregator, enforcer); empty: this process's own metrics"`
	SampleEvery time.Duration       `yaml:"sample_every" help:"how often the pipeline page's metrics are sampled"`
	ChartWindow time.Duration       `yaml:"chart_window" help:"how much history the per-minute usage charts show"`
	SessionTTL  time.Duration       `yaml:"session_ttl" help:"how long a console login lasts"`
	TLSCertFile string              `yaml:"tls_cert_file" help:"PEM certificate (chain) the console serves HTTPS with; with tls_key_file. Empty: plain HTTP (a warning is logged when listen is not a loopback address)"`
	TLSKeyFile  string              `yaml:"tls_key_file" help:"PEM private key of tls_cert_file"`
	HTTP        httpserver.Timeouts `yaml:"http"`
}

// DefaultConfig returns the defaults: loopback, the enforcer's default
// admin address.
func DefaultConfig() Config {
	return Config{
		Listen:      "127.0.0.1:9480",
		AdminURL:    "http://127.0.0.1:9471",
		SampleEvery: 5 * time.Second,
		ChartWindow: time.Hour,
		SessionTTL:  8 * time.Hour,
		HTTP:        httpserver.Defaults(),
	}
}

// maxSamples bounds the pipeline page's memory of metric samples.
const maxSamples = 720

// Validate names each bad field and its limit.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen: %q is not host:port", c.Listen)
	}
	if u, err := url.Parse(c.AdminURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("admin_url: %q is not an http(s) URL such as http://127.0.0.1:9471", c.AdminURL)
	}
	for i, m := range c.MetricsURLs {
		if u, err := url.Parse(m); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("metrics_urls[%d]: %q is not an http(s) URL such as http://127.0.0.1:9464/metrics", i, m)
		}
	}
	if len(c.MetricsURLs) > 50 {
		bad("metrics_urls: %d endpoints; the limit is 50", len(c.MetricsURLs))
	}
	if c.SampleEvery < time.Second || c.SampleEvery > 5*time.Minute {
		bad("sample_every: %v is outside 1s..5m", c.SampleEvery)
	}
	if c.ChartWindow < 5*time.Minute || c.ChartWindow > 7*24*time.Hour {
		bad("chart_window: %v is outside 5m..168h", c.ChartWindow)
	}
	if c.SessionTTL < time.Minute || c.SessionTTL > 7*24*time.Hour {
		bad("session_ttl: %v is outside 1m..168h", c.SessionTTL)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("tls_cert_file, tls_key_file: set both (a PEM certificate and its key) or neither")
	}
	if err := c.HTTP.Validate("http"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
