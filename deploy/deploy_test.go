package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/emitter"
	"github.com/sluicehq/sluice/services/aggregator"
	"github.com/sluicehq/sluice/services/alerter"
	"github.com/sluicehq/sluice/services/enforcer"
	"github.com/sluicehq/sluice/services/gateway"
	"github.com/sluicehq/sluice/services/ingest"
	"github.com/sluicehq/sluice/services/reconciler"
)

// inventory is a prometheus.Registerer that keeps the names of the series
// the collectors registered on it export: a histogram's or summary's with
// their _bucket, _sum and _count.
type inventory map[string]bool

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (inv inventory) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		inv[m[1]] = true
		switch kind(c) {
		case "histogram":
			inv[m[1]+"_bucket"], inv[m[1]+"_sum"], inv[m[1]+"_count"] = true, true, true
		case "summary":
			inv[m[1]+"_sum"], inv[m[1]+"_count"] = true, true
		}
	}
	return nil
}

// kind says whether c is a histogram or a summary (their series have
// suffixes): by type for vectors, which may have no child yet, else by
// what it collects.
func kind(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	k := ""
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		switch {
		case d.Histogram != nil:
			k = "histogram"
		case d.Summary != nil:
			k = "summary"
		}
	}
	return k
}

func (inv inventory) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = inv.Register(c)
	}
}

func (inv inventory) Unregister(prometheus.Collector) bool { return true }

// registered builds every Sluice component's collectors in this process
// and returns the series names they export, with the process collectors
// ops adds to every registry.
func registered(t *testing.T) inventory {
	t.Helper()
	inv := inventory{}
	aggregator.RegisterMetrics(inv)
	for name, err := range map[string]error{
		"admission":  admission.RegisterMetrics(inv),
		"enforcer":   enforcer.RegisterMetrics(inv),
		"alerter":    alerter.RegisterMetrics(inv),
		"gateway":    gateway.RegisterMetrics(inv),
		"ingest":     ingest.RegisterMetrics(inv),
		"reconciler": reconciler.RegisterMetrics(inv),
		"emitter":    emitter.RegisterMetrics(inv),
	} {
		if err != nil {
			t.Fatalf("%s metrics: %v", name, err)
		}
	}
	if _, err := pricetable.NewFollower(nil, nil, inv, "reconciler"); err != nil {
		t.Fatal(err)
	}
	fams, err := ops.NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		inv[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			inv[f.GetName()+"_bucket"], inv[f.GetName()+"_sum"], inv[f.GetName()+"_count"] = true, true, true
		}
	}
	if len(inv) < 50 {
		t.Fatalf("only %d series registered: the inventory is broken", len(inv))
	}
	return inv
}

// Series Prometheus itself makes up rather than scrapes.
var synthetic = map[string]bool{"up": true, "ALERTS": true, "ALERTS_FOR_STATE": true}

var (
	strLit     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	braces     = regexp.MustCompile(`\{[^}]*\}`)
	brackets   = regexp.MustCompile(`\[[^\]]*\]`)
	grouping   = regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	variables  = regexp.MustCompile(`\$\{?\w+\}?`)
	identifier = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	keywords   = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true, "atan2": true,
		"sum": true, "min": true, "max": true, "avg": true, "count": true, "stddev": true, "stdvar": true, "topk": true,
		"bottomk": true, "quantile": true, "count_values": true, "group": true}
)

// metricNames returns the series names a PromQL expression selects: every
// identifier once strings, label matchers, ranges, grouping clauses and
// Grafana variables are removed, that is neither a function (followed by
// "(") nor a keyword.
func metricNames(expr string) []string {
	e := strLit.ReplaceAllString(expr, `""`)
	e = braces.ReplaceAllString(e, " ")
	e = brackets.ReplaceAllString(e, " ")
	e = grouping.ReplaceAllString(e, " ")
	e = variables.ReplaceAllString(e, " ")
	var out []string
	for _, loc := range identifier.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // the exponent or unit of a number: 1e-9, 26h
		}
		if keywords[strings.ToLower(id)] || strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " \t\n"), "(") {
			continue
		}
		out = append(out, id)
	}
	return out
}

func TestMetricNamesOfPromQL(t *testing.T) {
	got := metricNames(`sum by (rule) (rate(a_total{result="refused", x=~"b|c"}[5m])) / on(le) group_left(x) clamp_min(sum(rate(b_bucket[$__rate_interval])), 1e-9) > 26 * 3600 and time() - c:rec:max offset 5m`)
	if strings.Join(got, " ") != "a_total b_bucket c:rec:max" {
		t.Fatalf("metricNames = %v", got)
	}
}

// rulesFile is the part of a Prometheus rules file the checks read.
type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// query is one PromQL expression and where it is written.
type query struct{ where, expr string }

func ruleQueries(t *testing.T) (qs []query, recorded map[string]bool) {
	t.Helper()
	files, _ := filepath.Glob("prometheus/rules/*.yml")
	if len(files) == 0 {
		t.Fatal("no rules files in prometheus/rules")
	}
	recorded = map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rf rulesFile
		if err := yaml.Unmarshal(b, &rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					recorded[r.Record] = true
				}
				qs = append(qs, query{f + ": " + r.Record + r.Alert, r.Expr})
			}
		}
	}
	return qs, recorded
}

// dashboard is the part of a Grafana dashboard the checks read; rows nest
// panels.
type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
		// RawSQL is a ClickHouse panel's query (per-user figures come from
		// ClickHouse, never from Prometheus labels).
		RawSQL string `json:"rawSql"`
	} `json:"targets"`
}

// dashboardQueries returns the dashboards' PromQL queries; sqlQueries
// returns their ClickHouse ones.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	qs, _ := dashboardTargets(t)
	return qs
}

func sqlQueries(t *testing.T) []query {
	t.Helper()
	_, qs := dashboardTargets(t)
	return qs
}

func dashboardTargets(t *testing.T) (promql, sql []query) {
	t.Helper()
	files, _ := filepath.Glob("grafana/dashboards/*.json")
	var qs []query
	uids := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s is not a dashboard: %v", f, err)
		}
		if d.UID == "" || uids[d.UID] {
			t.Errorf("%s: uid %q missing or taken by another dashboard", f, d.UID)
		}
		uids[d.UID] = true
		var walk func([]panel)
		walk = func(ps []panel) {
			for _, p := range ps {
				walk(p.Panels)
				for _, tg := range p.Targets {
					if tg.RawSQL != "" {
						sql = append(sql, query{f + ": " + p.Title, tg.RawSQL})
						continue
					}
					qs = append(qs, query{f + ": " + p.Title, tg.Expr})
				}
			}
		}
		walk(d.Panels)
	}
	sort.Slice(sql, func(i, j int) bool { return sql[i].where < sql[j].where })
	// The dashboards the deployment promises.
	for _, uid := range []string{"sluice-pipeline", "sluice-quotas", "sluice-enforcement", "sluice-alerts", "sluice-traffic"} {
		if !uids[uid] {
			t.Errorf("no dashboard %s in grafana/dashboards", uid)
		}
	}
	return qs, sql
}

// TestQueriesNameOnlyRegisteredMetrics: a dashboard panel or a rule that
// names a series no Sluice component registers (a typo, a renamed metric)
// shows nothing and alerts never; this fails on it instead.
func TestQueriesNameOnlyRegisteredMetrics(t *testing.T) {
	inv := registered(t)
	rules, recorded := ruleQueries(t)
	qs := append(rules, dashboardQueries(t)...)
	checked := 0
	for _, q := range qs {
		if strings.TrimSpace(q.expr) == "" {
			t.Errorf("%s: empty query", q.where)
			continue
		}
		for _, n := range metricNames(q.expr) {
			checked++
			if !inv[n] && !recorded[n] && !synthetic[n] {
				t.Errorf("%s: %q is not a metric any Sluice service registers nor a recording rule\n\tin %s", q.where, n, strings.TrimSpace(q.expr))
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d metric references checked", checked)
	}
	if testing.Verbose() {
		names := make([]string, 0, len(inv))
		for n := range inv {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Logf("%d queries, %d references against %d registered series", len(qs), checked, len(names))
	}
}

// promtool returns the path of promtool (Debian's prometheus package,
// installed by scripts/services.sh), skipping the test without it unless
// CI=true.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found: run scripts/services.sh install (Debian package prometheus)")
		}
		t.Skip("promtool not found; scripts/services.sh install provides it")
	}
	return p
}

// TestRulesPassPromtool: `promtool check rules` on every rules file and
// `promtool test rules` on every unit-test file beside prometheus.yml.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	rules, _ := filepath.Glob("prometheus/rules/*.yml")
	tests, _ := filepath.Glob("prometheus/*_test.yml")
	if len(rules) == 0 || len(tests) == 0 {
		t.Fatalf("rules %v, unit tests %v: want both", rules, tests)
	}
	for i := range rules {
		rules[i] = strings.TrimPrefix(rules[i], "prometheus/")
	}
	for i := range tests {
		tests[i] = strings.TrimPrefix(tests[i], "prometheus/")
	}
	for _, args := range [][]string{append([]string{"check", "rules"}, rules...), append([]string{"test", "rules"}, tests...)} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus" // the unit-test files name rules relative to it
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
