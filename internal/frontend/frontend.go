package frontend

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// FrontEnd is what every request-path front end of Sluice configures
// alike — sluice gateway, which proxies the call, and services/authz,
// which answers a proxy's forward-auth check: its HTTP server's timeouts
// and shutdown, the flag Checker it asks, the admission it asks before a
// call, and where its usage events go. U is the front end's usage
// section: UsageConfig for the gateway, EventSink for authz (which meters
// no calls, so sends no estimates). A front end's Config embeds it inline,
// so its settings sit in the front end's section (services.<name>.http,
// .shutdown_timeout, .checker, .admission, .usage).
type FrontEnd[U UsageSection] struct {
	HTTP            httpserver.Timeouts `yaml:"http"`
	ShutdownTimeout time.Duration       `yaml:"shutdown_timeout" help:"on shutdown, how long requests in flight get to finish (a forward-auth check; a gateway call, its stream included); those still running are then cut, and the gateway settles them with what they used"`

	Checker   checker.Config  `yaml:"checker"`
	Admission AdmissionConfig `yaml:"admission"`
	Usage     U               `yaml:"usage"`
}

// UsageSection is a front end's usage section: an EventSink, or one that
// embeds it.
type UsageSection interface {
	Validate(p string) error
}

// DefaultFrontEnd returns a front end's defaults with usage as its usage
// section: the default Checker and admission (off until a policy file is
// named), and HTTP timeouts and a shutdown sized for short calls (a
// front end whose answers stream sets longer ones).
func DefaultFrontEnd[U UsageSection](usage U) FrontEnd[U] {
	return FrontEnd[U]{
		HTTP:            httpserver.Timeouts{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: 10 * time.Second, Idle: 2 * time.Minute},
		ShutdownTimeout: 5 * time.Second,
		Checker:         checker.DefaultConfig(),
		Admission:       DefaultAdmission(),
		Usage:           usage,
	}
}

// Validate checks the front end's settings, naming each as p<setting>
// (p is the front end's section with its dot, e.g. services.authz.).
func (f FrontEnd[U]) Validate(p string) error {
	var errs []error
	if err := f.HTTP.Validate(p + "http"); err != nil {
		errs = append(errs, err)
	}
	if f.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%sshutdown_timeout: must be positive", p))
	}
	if err := f.Checker.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%schecker.%w", p, err))
	}
	if err := f.Admission.Validate(p + "admission."); err != nil {
		errs = append(errs, err)
	}
	if err := f.Usage.Validate(p + "usage"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// serviceMetrics is env's registry with every series of the collectors
// registered on it labelled service=<service>. The Emitter and admission
// are collectors each front end of a process has its own of (`sluice run
// gateway authz`): labelled, they are one series each instead of a second
// registration the registry refuses.
func ServiceMetrics(env platform.Env, service string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"service": service}, env.Metrics)
}

// OrAllowAll returns d, or, for a nil d, a Decider that allows every call:
// a front end without a Checker (no flags configured) refuses no one by
// them.
func OrAllowAll(d middleware.Decider) middleware.Decider {
	if d == nil {
		return allowAll{}
	}
	return d
}

type allowAll struct{}

func (allowAll) Check(string, string, string) checker.Decision { return checker.Decision{} }
