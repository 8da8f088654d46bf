package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/demo/dashboard"
	"github.com/sluicehq/sluice/demo/loadgen"
	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/quotastatus/chstate"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/gateway"
)

// Demo addresses: fixed so the README can name them, all on loopback.
const (
	demoGatewayAddr  = "127.0.0.1:18080"
	demoIngestAddr   = "127.0.0.1:18081"
	demoUpstreamAddr = "127.0.0.1:18090"
	demoConsoleAddr  = "127.0.0.1:18088"
)

// demoTenants are the load generator's customers; their plans are in
// deploy/demo/policy.yaml.
var demoTenants = []loadgen.Tenant{
	// About 6,300 tokens a second against a 500,000-token hourly quota:
	// 70% after ~55 s, 100% after ~80 s.
	{Name: "runaway", APIKey: "sk-demo-runaway", Model: "gpt-4o-mini", RequestsPerSecond: 12, PromptChars: 1600, MaxTokens: 120},
	{Name: "acme", APIKey: "sk-demo-acme", Model: "gpt-4o", RequestsPerSecond: 4, PromptChars: 800, MaxTokens: 200, Stream: true},
	{Name: "trial", APIKey: "sk-demo-trial", Model: "gpt-4o-mini", RequestsPerSecond: 1, PromptChars: 400, MaxTokens: 60},
	// With acme (high), these compete for gpt-4o, whose upstream answers
	// at most 8 calls per 400 ms (20/s): together about twice that.
	{Name: "vip", APIKey: "sk-demo-vip", Model: "gpt-4o", RequestsPerSecond: 4, PromptChars: 400, MaxTokens: 60, MaxInFlight: 40},
	{Name: "batch", APIKey: "sk-demo-batch", Model: "gpt-4o", RequestsPerSecond: 30, PromptChars: 400, MaxTokens: 60, MaxInFlight: 200},
}

// demoPriority is each demo tenant's class in deploy/demo/policy.yaml,
// for the live view.
var demoPriority = map[string]schemas.Priority{"runaway": schemas.PriorityNormal, "acme": schemas.PriorityHigh, "trial": schemas.PriorityNormal,
	"vip": schemas.PriorityCritical, "batch": schemas.PriorityLow}

// The premium model's upstream capacity in the demo: 8 calls in flight,
// 400 ms each; past it every call slows in proportion.
const (
	demoPremiumCapacity = 8
	demoPremiumLatency  = 400 * time.Millisecond
)

// demoConfig is the default configuration with the demo's own choices: a
// separate ClickHouse database and Redis prefix, the demo policy, quick
// alert timings, loopback ports.
func demoConfig() sluiceconfig.Config {
	c := sluiceconfig.Defaults()
	c.Log.Format = "text"
	c.ClickHouse.Database = "sluice_demo"
	c.Policy.File = filepath.Join("deploy", "demo", "policy.yaml")
	c.Services.Ingest.Listen = demoIngestAddr
	// A prefix per run: flags of an earlier demo (they live until their TTL)
	// must not refuse this run's tenants before it has metered anything.
	c.Redis.KeyPrefix = fmt.Sprintf("sluice-demo-%d:", time.Now().Unix())
	c.Services.Console.Listen = demoConsoleAddr
	c.Services.Gateway.Admission.MaxWait = demoAdmissionWait
	// Keys, tenants and plans made with sluicectl or the console reach the
	// demo's gateway and console at once, as in a deployment that follows
	// the admin topic.
	c.Services.Gateway.FollowAdmin, c.Services.Console.FollowAdmin = true, true
	c.Services.Alerter.Alertmanager.URL = envOr("SLUICE_ALERTMANAGER_URL", "http://127.0.0.1:19093")
	// Tiers must hold this long before they notify; short enough to watch.
	c.Services.Alerter.Rules.PendingFor = 5 * time.Second
	c.Services.Alerter.Rules.GroupWait = 5 * time.Second
	return c
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// demo runs the whole pipeline in this process with a mock LLM upstream,
// `sluice gateway` in front of it, a load generator and a live view. It starts from a
// fresh demo database each time, so the story replays from zero.
func demo(ctx context.Context, args []string) error {
	cfg := demoConfig()
	_, err := sluiceconfig.Load(&cfg, args, os.LookupEnv)
	if err != nil {
		return err
	}
	// The demo asks for the development broker by name, unless
	// kafka.brokers names a real one.
	cfg.Embedded.Enabled = len(cfg.Kafka.Brokers) == 0
	logPath := filepath.Join(".services", "log", "sluice-demo.log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	log := logging.New(cfg.Log, logFile)
	fmt.Printf("sluice demo: service logs go to %s\n", logPath)

	if err := resetDemoDatabase(ctx, cfg.ClickHouse); err != nil {
		return err
	}
	return newDemoRun(demoGatewayAddr, demoUpstreamAddr, demoTenants, os.Stdout, isTerminal(os.Stdout)).run(ctx, &cfg, log)
}

// demoRun is one run of the demo: where its gateway and mock upstream
// listen (ingest and the console: cfg), its tenants and where the live
// view goes. `sluice demo` uses the fixed loopback addresses; the demo's
// test its own.
type demoRun struct {
	gateway, upstream string
	tenants           []loadgen.Tenant
	out               io.Writer
	tty               bool
	gen               *loadgen.Generator
	// milestones are the runaway's (the first tenant's) first prediction
	// and predictive alert as the live view showed them.
	milestones *dashboard.Milestones
}

// newDemoRun returns a run whose gateway listens on gatewayAddr and mock
// upstream on upstreamAddr, with tenants (the first is the runaway the
// view follows) and the live view on out.
func newDemoRun(gatewayAddr, upstreamAddr string, tenants []loadgen.Tenant, out io.Writer, tty bool) *demoRun {
	gen := &loadgen.Generator{URL: "http://" + gatewayAddr, Tenants: tenants}
	runaway := tenants[0].Name
	return &demoRun{gateway: gatewayAddr, upstream: upstreamAddr, tenants: tenants, out: out, tty: tty, gen: gen,
		milestones: &dashboard.Milestones{Tenant: runaway, Alert: alert.RuleExhaustionPredicted.AlertName(),
			Started: gen.Counts(runaway).Started}}
}

// run runs the pipeline, the gateway, the mock upstream, the load and the
// live view until ctx ends.
func (d *demoRun) run(ctx context.Context, cfg *sluiceconfig.Config, log *slog.Logger) error {
	keysFile, ingestKey, err := writeDemoKeys()
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(keysFile))
	cfg.Services.Ingest.GatewayKeys.File = keysFile
	if err := d.configureGateway(cfg, filepath.Dir(keysFile), ingestKey); err != nil {
		return err
	}
	if err := demoSignalKey(&cfg.SignalAuth); err != nil {
		return err
	}
	adminToken, err := demoAdminToken(cfg)
	if err != nil {
		return err
	}

	var host hostOptions
	p, err := preparePipeline(ctx, cfg, demoServices, &host, log)
	if err != nil {
		return err
	}
	defer p.close()

	rdb := redisconn.NewClient(cfg.Redis)
	defer rdb.Close()
	ccfg := checker.DefaultConfig()
	ccfg.KeyPrefix = cfg.Redis.Prefix(redisconn.FlagKeys)
	chk, err := checker.New(rdb, ccfg, log.With("component", "checker"))
	if err != nil {
		return err
	}
	// Admission before the call: the gateway's, built from the demo
	// policy's limits (trial's trial-tpm refuses before the upstream),
	// through the counts the live view shows.
	admCounts := newAdmissionCounts()
	host.gateway = append(host.gateway, gateway.WithAdmitterWrap(admCounts.wrap))
	// The guards of the policy's upstreams (premium: gpt-4o), which the
	// gateway follows the policy with and the live view shows.
	grdb := redisconn.NewClient(cfg.Redis, redisconn.ContextTimeouts())
	defer grdb.Close()
	moves := &limitMoves{n: map[string]int{}}
	guards := gateway.NewGuards(grdb, cfg.Redis.Prefix(redisconn.UpstreamKeys), gateway.ProcessID("demo-gateway"),
		log.With("component", "upstream"), moves.moved)
	defer guards.Close()
	host.gateway = append(host.gateway, gateway.WithGuards(guards))
	gen := d.gen

	conn, err := chconn.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	src := &demoSource{status: quotastatus.New(chstate.New(conn), nil, nil), checker: chk, gen: gen, alertmanager: cfg.Services.Alerter.Alertmanager.URL, admissions: admCounts,
		guards: guards, moves: moves, tenants: d.tenants, milestones: d.milestones, since: time.Now()}

	// Ctrl-C stops the load first, then the gateway (its streams finish
	// against the mock, its last usage events are flushed), and ingest
	// only after the gateway (preparePipeline orders that), so that no
	// usage event of the run is lost.
	for i := range p.tasks {
		if p.tasks[i].Name == "gateway" {
			p.tasks[i].StopsAfter = append(p.tasks[i].StopsAfter, "loadgen")
		}
	}
	tasks := append(p.tasks,
		lifecycle.Task{Name: "checker", Run: chk.Run},
		lifecycle.Task{Name: "mock-llm", StopsAfter: []string{"gateway"},
			Run: serveHTTP(d.upstream, mockllm.New(mockllm.Options{StreamUsage: mockllm.UsageWhenAsked,
				Capacity: demoPremiumCapacity, Latency: demoPremiumLatency, CapacityModels: []string{"gpt-4o"}}))},
		lifecycle.Task{Name: "loadgen", Run: func(ctx context.Context) error {
			if err := waitReady(ctx, chk, cfg.Services.Ingest.Listen); err != nil {
				return err
			}
			return gen.Run(ctx)
		}},
		lifecycle.Task{Name: "dashboard", Run: func(ctx context.Context) error {
			return dashboard.Run(ctx, d.out, src, d.tty, time.Second, 5*time.Second, time.Now)
		}},
	)
	fmt.Fprintf(d.out, "sluice demo: gateway http://%s (OpenAI-compatible), ingest http://%s, metrics http://%s/metrics, Alertmanager %s\n",
		d.gateway, cfg.Services.Ingest.Listen, cfg.Ops.Listen, cfg.Services.Alerter.Alertmanager.URL)
	fmt.Fprintf(d.out, "sluice demo: web console http://%s (to act, log in with the admin token %s); usage API: curl -H 'Authorization: Bearer %s' http://%s/v1/usage\n",
		cfg.Services.Console.Listen, adminToken, d.tenants[0].APIKey, d.gateway)
	return lifecycle.Run(ctx, log, cfg.ShutdownTimeout, tasks...)
}

// demoServices are what the demo runs in its process: the whole pipeline
// and `sluice gateway` in front of the mock LLM.
var demoServices = []string{"ingest", "aggregator", "enforcer", "alerter", "reconciler", "gateway", "console"}

// configureGateway configures `sluice gateway` for the demo: the tenants' keys
// (only their hashes are written), the mock LLM as the one upstream of
// every model, the run's flag prefix, and ingest with the run's key.
func (d *demoRun) configureGateway(c *sluiceconfig.Config, dir, ingestKey string) error {
	g := &c.Services.Gateway
	g.Listen, g.Name = d.gateway, "demo-gateway"
	var keys strings.Builder
	keys.WriteString("keys:\n")
	for _, t := range d.tenants {
		keys.WriteString(frontend.KeyLine("key-"+t.Name, t.APIKey, t.Name, nil))
	}
	c.TenantKeys.File = filepath.Join(dir, "gateway-keys.yaml")
	if err := os.WriteFile(c.TenantKeys.File, []byte(keys.String()), 0o600); err != nil {
		return err
	}
	// The policy's upstreams send gpt-4o to the mock's capacity-bound
	// premium model and every other model to the rest of it, at the demo's
	// mock address: a run whose mock listens elsewhere (the demo's test)
	// gets a copy of the policy that says so.
	if d.upstream != demoUpstreamAddr {
		src, err := os.ReadFile(c.Policy.File)
		if err != nil {
			return err
		}
		moved := strings.ReplaceAll(string(src), "http://"+demoUpstreamAddr+"/", "http://"+d.upstream+"/")
		c.Policy.File = filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(c.Policy.File, []byte(moved), 0o600); err != nil {
			return err
		}
	}
	g.Usage.Sink, g.Usage.IngestURL = frontend.SinkIngest, "http://"+c.Services.Ingest.Listen
	g.Usage.IngestAPIKeyFile = filepath.Join(dir, "ingest-key")
	g.Usage.FlushInterval = 50 * time.Millisecond
	return os.WriteFile(g.Usage.IngestAPIKeyFile, []byte(ingestKey+"\n"), 0o600)
}

// waitReady holds the load back until the gateway can see flags and ingest
// accepts events, so the first requests are metered.
func waitReady(ctx context.Context, chk *checker.Checker, ingest string) error {
	for {
		c, err := net.DialTimeout("tcp", ingest, time.Second)
		if err == nil {
			c.Close()
			if chk.Synced() {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func serveHTTP(addr string, h http.Handler) func(context.Context) error {
	return func(ctx context.Context) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w (is another demo running?)", addr, err)
		}
		srv := httpserver.New(h, httpserver.Defaults(), nil)
		return httpserver.ServeUntilDone(ctx, srv, ln, 5*time.Second)
	}
}

func resetDemoDatabase(ctx context.Context, c chconn.Config) error {
	if err := chconn.EnsureDatabase(ctx, c); err != nil {
		return fmt.Errorf("%w (start ClickHouse with `scripts/services.sh up clickhouse`)", err)
	}
	conn, err := chconn.Open(ctx, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Only the demo's own database: the story starts from zero every run.
	return conn.Exec(ctx, "DROP DATABASE IF EXISTS "+c.Database)
}

// writeDemoKeys creates the ingest keys file with a fresh random key for
// the demo's gateway; only its hash is written.
func writeDemoKeys() (path, key string, err error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	key = "sk-ingest-" + hex.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(key))
	dir, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "keys.yaml")
	body := fmt.Sprintf("keys:\n  - id: demo-gateway\n    sha256: %s\n    tenants: [\"*\"]\n", hex.EncodeToString(sum[:]))
	return path, key, os.WriteFile(path, []byte(body), 0o600)
}

// demoAdminToken turns the enforcer's admin API on for the run, with a
// fresh random token the console's login takes (printed with its URL),
// unless admin tokens are already configured.
func demoAdminToken(c *sluiceconfig.Config) (string, error) {
	if len(c.Services.Enforcer.Admin.Tokens) > 0 {
		return "(one of services.enforcer.admin.tokens)", nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := "sk-admin-" + hex.EncodeToString(b[:])
	c.Services.Enforcer.Admin.Tokens = []adminapi.Token{{Name: "demo-operator", SHA256: adminapi.HashToken(token)}}
	c.Services.Console.AdminURL = "http://" + c.Services.Enforcer.Admin.Listen
	return token, nil
}

// demoSignalKey gives the demo's services, all in this process, a fresh
// random signing key for the run, unless signal_auth already has keys or
// is explicitly off: the demo runs signed, like a real deployment, with
// nothing to configure.
func demoSignalKey(c *signalauth.Config) error {
	if c.Mode == signalauth.ModeOff || c.KeyFile != "" || len(c.Keys) > 0 {
		return nil
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	c.Keys = []string{"demo:" + hex.EncodeToString(b[:])}
	return nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// demoSource assembles the live view from the aggregator's quota state in
// ClickHouse, the gateway's Checker and admission, the load generator and
// Alertmanager.
type demoSource struct {
	status       *quotastatus.Service
	checker      *checker.Checker
	gen          *loadgen.Generator
	alertmanager string
	admissions   *admissionCounts
	guards       *gateway.Guards
	moves        *limitMoves
	tenants      []loadgen.Tenant
	milestones   *dashboard.Milestones
	// since is when this run started: the Alertmanager may be shared with
	// an earlier run whose alerts for the same tenant names still fire
	// (until resolved or expired, ~5 min), and those are not this run's.
	since time.Time
}

// Notes implements dashboard.Noter: how soon the runaway's prediction and
// predictive alert showed.
func (s *demoSource) Notes() []string { return s.milestones.Notes() }

// limitMoves counts the changes of each upstream's adaptive limit.
type limitMoves struct {
	mu sync.Mutex
	n  map[string]int
}

func (m *limitMoves) moved(upstream string, _ int) {
	m.mu.Lock()
	m.n[upstream]++
	m.mu.Unlock()
}

func (m *limitMoves) of(upstream string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n[upstream]
}

// Upstreams implements dashboard.UpstreamSource: the guarded upstreams'
// state, classes critical first.
func (s *demoSource) Upstreams() []dashboard.Upstream {
	var out []dashboard.Upstream
	for _, name := range s.guards.Names() {
		g := s.guards.Of(name)
		if g == nil {
			continue
		}
		st := g.Stats()
		u := dashboard.Upstream{Name: name, Limit: st.Queue.Limit, Changes: s.moves.of(name), InFlight: st.InFlight,
			Level: int(st.Level), Breaker: st.Breaker.State.String(), Load: st.Load}
		for i := range 4 {
			c := 3 - i // the view lists critical first, priority indexes low first
			u.Waiting[i], u.Admitted[i], u.Refused[i] = st.Queue.Waiting[c], st.Queue.Admitted[c], st.Queue.Refused[c]
		}
		out = append(out, u)
	}
	return out
}

// Rows reads each demo tenant's worst quota (closest to its limit, with
// its rate and predicted exhaustion) from the one read model of quota
// state (internal/quotastatus, as the console and GET /v1/usage read it),
// and what the gateway and the load generator did for it.
func (s *demoSource) Rows(ctx context.Context) ([]dashboard.Row, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	all, err := s.status.Overview(ctx)
	if err != nil {
		return nil, err
	}
	best := map[string]dashboard.Row{}
	for _, st := range all {
		if q := st.Worst(); q != nil {
			best[st.Tenant] = quotaRow(st.Tenant, q)
		}
	}
	alerts := s.alerts(ctx)
	out := make([]dashboard.Row, 0, len(best))
	for _, t := range s.tenants {
		r, ok := best[t.Name]
		if !ok {
			r = dashboard.Row{Tenant: t.Name, Model: "*"}
		}
		d := s.checker.Check(t.Name, t.Model, "key-"+t.Name)
		r.Breaker = "serving"
		if !d.Allowed() {
			r.Breaker = "refusing"
			if d.Flag != nil {
				r.Breaker = fmt.Sprintf("%s %s %s", d.Flag.State, d.Flag.Kind, d.Flag.Quota)
			}
		}
		c := s.gen.Counts(t.Name)
		r.Served, r.Refused, r.Fallback = c.OK.Load(), c.Quota429.Load()+c.Breaker503.Load(), c.Fallback.Load()
		r.Priority = string(demoPriority[t.Name])
		r.Admitted, r.AdmissionRefused, r.RefusedBy = s.admissions.of(t.Name)
		r.Alerts = alerts[t.Name]
		out = append(out, r)
	}
	s.milestones.Observe(out, time.Now())
	return out, nil
}

// quotaRow is the live view's row of tenant's quota q.
func quotaRow(tenant string, q *quotastatus.Quota) dashboard.Row {
	r := dashboard.Row{Tenant: tenant, Model: q.Model, Quota: string(q.Quota), Period: string(q.Period), Used: q.Used, Limit: q.Limit,
		RatePerMinute: q.RatePerMinute, ExhaustionBasis: q.PredictionBasis}
	for dst, src := range map[*time.Time]*time.Time{&r.Exhaustion: q.PredictedExhaustion, &r.ExhaustionEarliest: q.PredictedEarliest,
		&r.ExhaustionLatest: q.PredictedLatest} {
		if src != nil {
			*dst = *src
		}
	}
	return r
}

// alerts returns the firing alerts per tenant as "alertname/severity".
func (s *demoSource) alerts(ctx context.Context) map[string][]string {
	out := map[string][]string{}
	if s.alertmanager == "" {
		return out
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.alertmanager+"/api/v2/alerts?active=true&filter="+url.QueryEscape(`tenant=~".+"`), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	var list []struct {
		Labels   map[string]string `json:"labels"`
		StartsAt time.Time         `json:"startsAt"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return out
	}
	for _, a := range list {
		if a.StartsAt.Before(s.since) {
			continue
		}
		out[a.Labels["tenant"]] = append(out[a.Labels["tenant"]], a.Labels["alertname"]+"/"+a.Labels["severity"])
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}
