// Package console is Sluice's web console for operators, served by `sluice`
// on its own listener (services.console.listen) when the console service is
// named (`sluice run ... console`; `sluice demo` runs it and prints its
// URL). Three server-rendered pages, html/template with inline SVG charts
// and no script, readable on a phone:
//
//   - / — every tenant's quotas: used %, tier, current rate, predicted
//     exhaustion, the flags gateways enforce and the calls refused in the
//     last hour; sortable, filterable by tier and plan; quotas at 90% or
//     more are highlighted.
//   - /tenants/{tenant} — its quotas, a chart per model of use over the
//     period with the limit line and the forecast, per-minute use by
//     model, its flags and breakers with the admin actions, recent alerts.
//   - /pipeline — ingest rate, consumer lag, flush latency, enforcement
//     lag, sampled from the services' Prometheus metrics, and the events
//     counted per minute from ClickHouse.
//
// The quota figures come from quotastatus, the read model the tenants'
// usage API (GET /v1/usage) reads too, so the console and the API agree;
// with services.console.follow_admin the console follows the admin API's
// tenants and plans and lays them over its policy file as the gateways do,
// so that a tenant without use yet shows the quotas in force.
//
// Reading needs no login. Acting does: an operator logs in with an admin
// API token, which the console checks against the enforcer and keeps only
// in its memory (a random session cookie, HttpOnly and SameSite=Strict,
// names it); every action is posted to the enforcer's admin API with that
// token (adminapi.Client), so it is authenticated, validated and audited
// there exactly as `sluicectl admin` is, under the operator's name. Forms
// are protected against cross-site posting (http.CrossOriginProtection).
//
// An operator creates a tenant from a plan (/new-tenant, linked from the
// overview), and a tenant's page edits the
// quotas and limits of a tenant the admin API defines (tenants.go).
// A tenant's page also manages its API keys (keys.go): issue (the secret
// shown once, in the form's own answer), rotate and revoke with the
// version the page read, and each key's audit trail. What a page offers
// follows the token's role, which the login asks the enforcer for. A form
// the admin API refuses is shown again in place (forms.go).
package console

import (
	"context"
	"crypto/tls"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
)

//go:embed templates/*.html static/*
var assets embed.FS

// New returns the console of cfg in env; once started it serves on
// cfg.Listen (its Addr) until stopped.
func New(cfg Config, env platform.Env) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.console", err)
	}
	if cfg.FollowAdmin {
		if err := env.Topics.Check("admin"); err != nil {
			return nil, fmt.Errorf("services.console.follow_admin: %w", err)
		}
	}
	return platform.NewService("console", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, ready)
	}), nil
}

func run(ctx context.Context, cfg Config, env platform.Env, ready func(addr string)) error {
	env = env.Named("console")
	log := env.Logger
	pw, err := policyOf(cfg, env)
	if err != nil {
		return err
	}
	hc, err := adminapi.TrustingClient(cfg.AdminCAFile)
	if err != nil {
		return fmt.Errorf("services.console.admin_ca_file: %w", err)
	}
	tlsCfg, err := httpserver.LoadTLS(cfg.TLSCertFile, cfg.TLSKeyFile, "services.console.tls_cert_file", "services.console.tls_key_file")
	if err != nil {
		return err
	}
	ch := chconn.NewLazy(env.ClickHouse)
	defer ch.Close()
	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	var gatherer prometheus.Gatherer
	if g, ok := env.Metrics.(prometheus.Gatherer); ok {
		gatherer = g
	}
	s, err := newServer(cfg, deps{
		status:   usageapi.NewService(ch, rdb, env.Redis.Prefix(redisconn.FlagKeys), pw),
		ch:       ch,
		policy:   pw,
		admin:    hc,
		sampler:  newSampler(cfg.MetricsURLs, gatherer, maxSamples),
		log:      log,
		secure:   tlsCfg != nil,
		adminURL: cfg.AdminURL,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w (set services.console.listen to a free address)", cfg.Listen, err)
	}
	srv := httpserver.New(s.Handler(), cfg.HTTP, log)
	scheme := "http"
	if tlsCfg != nil {
		srv.TLSConfig = tlsCfg
		ln = tls.NewListener(ln, tlsCfg)
		scheme = "https"
	} else if host, _, _ := net.SplitHostPort(cfg.Listen); !httpserver.IsLoopback(host) {
		log.Warn("console: plain HTTP on a non-loopback address; admin tokens typed into the login form cross the network in clear text (set services.console.tls_cert_file and tls_key_file)", "addr", cfg.Listen)
	}
	log.Info("web console listening", "url", scheme+"://"+ln.Addr().String())
	ready(ln.Addr().String())
	g, gctx := errgroup.WithContext(ctx)
	if pw != nil {
		g.Go(func() error { return pw.Run(gctx) })
	}
	if cfg.FollowAdmin {
		g.Go(func() error { followRecords(gctx, env, pw); return nil })
	}
	g.Go(func() error { s.sampler.run(gctx, cfg.SampleEvery, log); return nil })
	g.Go(func() error { s.sessions.expireLoop(gctx, time.Minute); return nil })
	g.Go(func() error {
		if err := httpserver.ServeUntilDone(gctx, srv, ln, 5*time.Second); err != nil {
			return fmt.Errorf("console: serve: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// policyOf returns the watcher of the policy file, nil without one; with
// an admin topic, of the built-in defaults when there is no file, for the
// records to be laid over.
func policyOf(cfg Config, env platform.Env) (*policy.Watcher, error) {
	if env.Policy.File != "" {
		w, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, env.Logger)
		if err != nil {
			return nil, fmt.Errorf("policy.file: %w", err)
		}
		return w, nil
	}
	if !cfg.FollowAdmin {
		return nil, nil
	}
	return policy.FromData([]byte("{}\n"), "(built-in defaults)")
}

// followRecords lays the admin topic's tenants and plans over pw until ctx
// ends, so that the quota tables show the policy in force. Unlike a
// gateway, the console serves before it has read the topic, and serves on
// if it cannot: an operator needs its pages most when something is down,
// and until the records are read a tenant without use shows the file's
// quotas, as without the setting.
func followRecords(ctx context.Context, env platform.Env, pw *policy.Watcher) {
	log := env.Logger.With("component", "controlplane")
	f, stop, err := controlplane.FollowPolicy(ctx, "console", env, pw, nil)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("console: not following the admin topic: the quota tables show the policy file's quotas for tenants without use", "topic", env.Topics.Admin, "err", err)
		}
		return
	}
	defer stop()
	if err := f.CatchUp(ctx); err != nil && ctx.Err() == nil {
		log.Warn("console: reading the admin topic", "topic", env.Topics.Admin, "err", err)
	}
	log.Info("console: following the admin API's tenants and plans", "topic", env.Topics.Admin, "conflicts", pw.Conflicts())
	_ = f.Run(ctx)
}

// deps are what a server reads from and acts through.
type deps struct {
	status *quotastatus.Service
	ch     *chconn.Lazy
	// policy is the policy file's watcher (nil: no policy file); the
	// tenants and plans of its file are the ones the console does not
	// edit.
	policy   *policy.Watcher
	admin    *http.Client // nil: http.DefaultClient
	adminURL string
	sampler  *sampler
	log      *slog.Logger
	// secure marks the session cookie Secure (served over TLS).
	secure bool
}

// server is the console's HTTP side.
type server struct {
	deps
	cfg      Config
	pages    map[string]*template.Template
	sessions *sessions
	now      func() time.Time
}

func newServer(cfg Config, d deps) (*server, error) {
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	return &server{deps: d, cfg: cfg, pages: pages, sessions: newSessions(cfg.SessionTTL, maxSessions), now: time.Now}, nil
}

// Handler routes the pages, the actions and the static files, behind the
// cross-origin protection of every unsafe method.
func (s *server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /tenants/{tenant}", s.tenant)
	mux.HandleFunc("GET "+newTenantPath, s.newTenant)
	mux.HandleFunc("POST /tenants", s.createTenant)
	mux.HandleFunc("POST /tenants/{tenant}/section", s.updateTenant)
	mux.HandleFunc("POST /tenants/{tenant}/act", s.act)
	mux.HandleFunc("POST /tenants/{tenant}/keys", s.issueKey)
	mux.HandleFunc("GET /tenants/{tenant}/keys/{id}", s.keyPage)
	mux.HandleFunc("POST /tenants/{tenant}/keys/{id}/rotate", s.rotateKey)
	mux.HandleFunc("POST /tenants/{tenant}/keys/{id}/revoke", s.revokeKey)
	mux.HandleFunc("GET /tenants/{tenant}/audit", s.tenantAudit)
	mux.HandleFunc("GET /pipeline", s.pipeline)
	mux.HandleFunc("GET /login", s.loginForm)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.logout)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	return securityHeaders(http.NewCrossOriginProtection().Handler(mux))
}

// securityHeaders forbids framing (clickjacking of the action forms) and
// any script: the pages have none.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}
