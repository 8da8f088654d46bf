package console

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/quotastatus/chstate"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/console/svgchart"
)

// readTimeout bounds the reads of one page.
const readTimeout = 10 * time.Second

// parsePages parses each page with the shared layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"pct":   func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "%" },
		"num":   svgchart.Compact,
		"bar":   func(v float64) string { return strconv.FormatFloat(math.Max(0, math.Min(v, 100)), 'f', 1, 64) },
		"clock": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 MST") },
		// How far back the admin API looks for a key's last use.
		"keyUseDays": func() int { return int(adminapi.KeyUseLookback / (24 * time.Hour)) },
		// A quota is highlighted from the tier whose alerts are warnings.
		"hot":       func(v float64) bool { return v >= policy.WarningTier },
		"in":        func(now time.Time, t *time.Time) string { return until(now, t) },
		"inT":       func(now, t time.Time) string { return until(now, &t) },
		"sortURL":   sortURL,
		"tenantURL": tenantURL,
		"keyURL":    keyURL,
		"rateNum":   func(v float64) string { return svgchart.Compact(v) },
	}
	names, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[base] = t
	}
	return out, nil
}

// tenantURL is tenant's page.
func tenantURL(tenant string) string { return "/tenants/" + url.PathEscape(tenant) }

// page is what the layout needs besides a page's own data.
type page struct {
	Title    string
	Nav      string
	LoggedIn bool
	Now      time.Time
	// Refresh, when positive, reloads the page every so many seconds.
	Refresh int
	Data    any
}

func (s *server) render(w http.ResponseWriter, r *http.Request, name string, status int, data any) {
	p := page{Title: name, Nav: name, LoggedIn: s.sessions.get(r) != nil, Now: s.now().UTC(), Data: data}
	switch v := data.(type) {
	case overviewPage:
		p.Title, p.Refresh = "Tenants", 10
	case tenantPage:
		p.Title, p.Nav = "Tenant "+v.Status.Tenant, "overview"
	case pipelinePage:
		p.Title, p.Refresh = "Pipeline", 10
	case loginPage:
		p.Title = "Log in"
	case newTenantPage:
		p.Title, p.Nav = "Create a tenant", "overview"
	case secretPage:
		p.Title, p.Nav = "The secret of key "+v.Key.ID, "overview"
	case auditPage:
		p.Title, p.Nav = "Changes of "+v.Tenant, "overview"
		if v.Key != nil {
			p.Title = "Key " + v.Key.ID
		}
	}
	var buf bytes.Buffer
	if err := s.pages[name].Execute(&buf, p); err != nil {
		s.log.Error("console: rendering a page failed", "page", name, "err", err)
		http.Error(w, "rendering the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *server) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	s.render(w, r, "error", status, errorPage{Message: msg})
}

// errorPage says what went wrong.
type errorPage struct{ Message string }

// overviewRow is one quota of one tenant on the overview.
type overviewRow struct {
	Tenant, Plan string
	Quota        quotastatus.Quota
	HasQuota     bool
	// Flag sums up the flags that apply to the quota's model, "serving"
	// when none does.
	Flag     string
	Refusing bool
	Refused  int64
}

// overviewPage is the tenants overview's data.
type overviewPage struct {
	Rows        []overviewRow
	Tenants     int
	Sort, Order string
	Tier        int
	Plan        string
	Plans       []string
	Tiers       []int
	Now         time.Time
	// CanCreate: the session may create tenants (operators).
	CanCreate bool
}

// sortKeys are the overview's sortable columns, with their default order.
var sortKeys = map[string]string{"tenant": "asc", "used": "desc", "tier": "desc", "rate": "desc", "exhaustion": "asc", "refused": "desc"}

func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	all, err := s.status.Overview(ctx)
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "Reading the quota state failed: "+err.Error())
		return
	}
	q := r.URL.Query()
	pg := overviewPage{Sort: q.Get("sort"), Order: q.Get("order"), Plan: q.Get("plan"), Tiers: s.tiers(), Now: s.now().UTC()}
	if _, ok := sortKeys[pg.Sort]; !ok {
		pg.Sort = "used"
	}
	if pg.Order != "asc" && pg.Order != "desc" {
		pg.Order = sortKeys[pg.Sort]
	}
	pg.Tier, _ = strconv.Atoi(q.Get("tier"))
	plans := map[string]bool{}
	sess := s.sessions.get(r)
	for _, st := range all {
		if sess != nil && !sess.maySee(st.Tenant) {
			continue
		}
		if st.Plan != "" {
			plans[st.Plan] = true
		}
		if pg.Plan != "" && st.Plan != pg.Plan {
			continue
		}
		rows := 0
		for _, qu := range st.Quotas {
			if qu.Tier < pg.Tier {
				continue
			}
			flag, refusing := flagSummary(st.Flags, qu.Model)
			pg.Rows = append(pg.Rows, overviewRow{Tenant: st.Tenant, Plan: st.Plan, Quota: qu, HasQuota: true, Flag: flag, Refusing: refusing, Refused: st.RefusedLastHour})
			rows++
		}
		if len(st.Quotas) == 0 && pg.Tier == 0 {
			flag, refusing := flagSummary(st.Flags, "*")
			pg.Rows = append(pg.Rows, overviewRow{Tenant: st.Tenant, Plan: st.Plan, Flag: flag, Refusing: refusing, Refused: st.RefusedLastHour})
			rows++
		}
		if rows > 0 {
			pg.Tenants++
		}
	}
	for p := range plans {
		pg.Plans = append(pg.Plans, p)
	}
	sort.Strings(pg.Plans)
	sortRows(pg.Rows, pg.Sort, pg.Order == "desc")
	pg.CanCreate = sess != nil && sess.mayAct()
	s.render(w, r, "overview", http.StatusOK, pg)
}

func sortRows(rows []overviewRow, key string, desc bool) {
	less := func(a, b overviewRow) int {
		switch key {
		case "tenant":
			return strings.Compare(a.Tenant, b.Tenant)
		case "tier":
			return a.Quota.Tier - b.Quota.Tier
		case "rate":
			return cmp.Compare(a.Quota.RatePerMinute, b.Quota.RatePerMinute)
		case "refused":
			return int(a.Refused - b.Refused)
		case "exhaustion":
			// Quotas without a prediction come last either way.
			pa, pb := a.Quota.PredictedExhaustion, b.Quota.PredictedExhaustion
			switch {
			case pa == nil && pb == nil:
				return 0
			case pa == nil:
				if desc {
					return -1
				}
				return 1
			case pb == nil:
				if desc {
					return 1
				}
				return -1
			}
			return pa.Compare(*pb)
		}
		return cmp.Compare(a.Quota.UsedPercent, b.Quota.UsedPercent)
	}
	slices.SortStableFunc(rows, func(a, b overviewRow) int {
		c := less(a, b)
		if desc {
			c = -c
		}
		if c == 0 {
			c = strings.Compare(a.Tenant, b.Tenant)
		}
		return c
	})
}

// sortURL is the overview link that sorts by key, flipping the order when
// it already sorts by key, keeping the filters.
func sortURL(pg overviewPage, key string) string {
	order := sortKeys[key]
	if pg.Sort == key {
		order = map[string]string{"asc": "desc", "desc": "asc"}[pg.Order]
	}
	v := url.Values{"sort": {key}, "order": {order}}
	if pg.Tier > 0 {
		v.Set("tier", strconv.Itoa(pg.Tier))
	}
	if pg.Plan != "" {
		v.Set("plan", pg.Plan)
	}
	return "/?" + v.Encode()
}

// flagSummary sums up the flags that stop calls to model: its own, the
// tenant-wide ones and (for any model) those on API keys.
func flagSummary(fl []quotastatus.Flag, model string) (string, bool) {
	var parts []string
	refusing := false
	for _, f := range fl {
		if f.APIKeyID == "" && f.Model != model && f.Model != flags.AllModels && model != flags.AllModels {
			continue
		}
		p := string(f.State) + " " + string(f.Kind)
		if f.Quota != "" {
			p += " " + f.Quota
		}
		if f.APIKeyID != "" {
			p += " (key " + f.APIKeyID + ")"
		} else if f.Model != flags.AllModels {
			p += " (" + f.Model + ")"
		}
		parts = append(parts, p)
		refusing = refusing || f.Refusing()
	}
	if len(parts) == 0 {
		return "serving", false
	}
	return strings.Join(parts, "; "), refusing
}

// until writes how far t is from now: "in 3m20s", "2m ago", "-" for nil.
func until(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	d := t.Sub(now).Round(time.Second)
	if d >= 0 {
		return "in " + d.String()
	}
	return (-d).String() + " ago"
}

// chartView is one chart of the tenant page.
type chartView struct {
	Title, Caption string
	SVG            template.HTML
	Points         int
}

// tenantPage is the tenant page's data.
type tenantPage struct {
	Status    quotastatus.Status
	Charts    []chartView
	Signals   []chstate.Signal
	Breakers  []adminapi.Breaker
	Overrides []adminapi.Override
	// AdminError says why breakers and overrides could not be listed.
	AdminError string
	LoggedIn   bool
	Models     []string
	Quotas     []schemas.QuotaKind
	Kinds      []flags.Kind
	Actions    map[string]adminapi.Action
	Done       string
	ChartError string
	Now        time.Time
	// Who is the session's token; CanAct: it may change breakers and
	// overrides (operators); CanKeys: it may change this tenant's keys.
	Who             adminapi.WhoAmIResponse
	CanAct, CanKeys bool
	Keys            []keyView
	// KeysError says why the keys could not be listed.
	KeysError string
	// Form is a refused form shown again in place.
	Form formState
	// IssueID is the key id the issue form carries (issueKey).
	IssueID string
	// Section is the tenant's definition (tenants.go); logged in only.
	Section tenantSection
}

func (s *server) tenant(w http.ResponseWriter, r *http.Request) {
	s.showTenant(w, r, formState{})
}

// showTenant renders tenant's page, with form shown again in place when
// the admin API refused it (its status is the page's).
func (s *server) showTenant(w http.ResponseWriter, r *http.Request, form formState) {
	tenant := r.PathValue("tenant")
	sess := s.sessions.get(r)
	if sess != nil && !sess.maySee(tenant) {
		s.fail(w, r, http.StatusForbidden, fmt.Sprintf("Your token (%s) administers tenant %s only.", sess.who.Name, sess.who.Tenant))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	st, err := s.status.Tenant(ctx, tenant)
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, quotastatus.ErrBadTenant) {
			status = http.StatusBadRequest
		}
		s.fail(w, r, status, err.Error())
		return
	}
	now := s.now().UTC()
	pg := tenantPage{Status: st, Now: now, Done: r.URL.Query().Get("done"),
		Quotas: schemas.QuotaKinds(), Kinds: []flags.Kind{flags.KindQuota, flags.KindRate, flags.KindErrorRatio, flags.KindSlowCall, flags.KindManual, flags.KindBlacklist},
		Actions: map[string]adminapi.Action{"trip": adminapi.ActionTrip, "reset": adminapi.ActionReset, "blacklist": adminapi.ActionBlacklist,
			"unblacklist": adminapi.ActionUnblacklist, "override": adminapi.ActionSetOverride, "unoverride": adminapi.ActionClearOverride},
		Form: form, IssueID: cmp.Or(form.Value("issue", "id"), controlplane.NewID())}
	models := map[string]bool{flags.AllModels: true}
	for _, q := range st.Quotas {
		models[q.Model] = true
	}
	if conn, err := s.ch.Get(ctx); err != nil {
		pg.ChartError = err.Error()
	} else {
		store := chstate.New(conn)
		charts, seen, err := s.charts(ctx, store, st, now)
		if err != nil {
			pg.ChartError = err.Error()
		}
		pg.Charts = charts
		for m := range seen {
			models[m] = true
		}
		if pg.Signals, err = store.Signals(ctx, tenant, 20); err != nil && pg.ChartError == "" {
			pg.ChartError = err.Error()
		}
	}
	for m := range models {
		pg.Models = append(pg.Models, m)
	}
	sort.Strings(pg.Models)
	if sess != nil {
		pg.LoggedIn, pg.Who, pg.CanAct, pg.CanKeys = true, sess.who, sess.mayAct(), sess.mayManage(tenant)
		// A tenant administrator may not read the fleet's breakers and
		// overrides; the enforcer would refuse it.
		if sess.who.Role != adminapi.RoleTenantAdmin {
			if pg.Breakers, err = sess.client.Breakers(ctx, tenant); err != nil {
				pg.AdminError = err.Error()
			} else if pg.Overrides, err = sess.client.Overrides(ctx, tenant); err != nil {
				pg.AdminError = err.Error()
			}
		}
		pg.Section = s.sectionOf(ctx, sess, tenant, form)
		if pg.Keys, err = keysOf(ctx, sess, tenant, now); err != nil {
			pg.KeysError = err.Error()
			if ae := (*adminapi.Error)(nil); errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound {
				pg.KeysError = "this enforcer serves no API keys: it is older than the admin API's keys (docs/controlplane.md)"
			}
		}
	}
	s.render(w, r, "tenant", cmp.Or(form.Status, http.StatusOK), pg)
}

// charts draws, for each model key with quotas, its use over the period
// of its most used quota against the limit, with the aggregator's
// forecast; and the per-minute use of every model. It returns the models
// seen in usage_minute too.
func (s *server) charts(ctx context.Context, store *chstate.Store, st quotastatus.Status, now time.Time) ([]chartView, map[string]bool, error) {
	from := now.Add(-s.cfg.ChartWindow).Truncate(time.Minute)
	minutes, err := store.Minutes(ctx, st.Tenant, from, now.Add(time.Minute))
	if err != nil {
		return nil, nil, err
	}
	byModel := map[string][]chstate.Minute{}
	for _, m := range minutes {
		byModel[m.Model] = append(byModel[m.Model], m)
	}
	seen := map[string]bool{}
	var out []chartView
	// The quota to chart per model key: the most used one of the longest
	// periods first shown (a minute quota only when it is the only one).
	pick := map[string]quotastatus.Quota{}
	var keys []string
	for _, q := range st.Quotas {
		cur, ok := pick[q.Model]
		better := !ok || (cur.Period == schemas.PeriodMinute && q.Period != schemas.PeriodMinute) ||
			((cur.Period == schemas.PeriodMinute) == (q.Period == schemas.PeriodMinute) && q.UsedPercent > cur.UsedPercent)
		if !ok {
			keys = append(keys, q.Model)
		}
		if better {
			pick[q.Model] = q
		}
	}
	for _, model := range keys {
		q := pick[model]
		out = append(out, s.quotaChart(q, byModel[model], from, now))
	}
	// Per-minute use of each model.
	var series []svgchart.Series
	var names []string
	for m := range byModel {
		seen[m] = true
		if m != flags.AllModels {
			names = append(names, m)
		}
	}
	sort.Strings(names)
	for _, m := range names {
		ser := svgchart.Series{Name: m}
		for _, mi := range byModel[m] {
			ser.Points = append(ser.Points, svgchart.Point{T: mi.Minute, V: mi.Tokens})
		}
		series = append(series, ser)
	}
	c := svgchart.Chart{Title: "Tokens per minute by model", Series: series, From: from, To: now}
	for _, q := range st.Quotas {
		if q.Model == flags.AllModels && q.Quota == schemas.QuotaTokensPerMinute {
			c.Limit, c.LimitLabel = q.Limit, "tokens_per_minute "+svgchart.Compact(q.Limit)
		}
	}
	out = append(out, chartView{Title: "Tokens per minute by model", Caption: "last " + s.cfg.ChartWindow.String() + ": " + strings.Join(names, ", "),
		SVG: c.SVG(), Points: c.PointCount()})
	return out, seen, nil
}

// quotaChart draws one quota: what the period used so far (per minute,
// from usage_minute, ending at the quota's current use), the limit, and
// the forecast to the predicted exhaustion (or along the current rate to
// the end of the chart). A minute quota is drawn per minute instead.
func (s *server) quotaChart(q quotastatus.Quota, minutes []chstate.Minute, from, now time.Time) chartView {
	title := fmt.Sprintf("%s — %s (%s)", q.Model, q.Quota, q.Period)
	used := svgchart.Series{Name: "used"}
	c := svgchart.Chart{Title: title, Limit: q.Limit, LimitLabel: fmt.Sprintf("limit %s %s", svgchart.Compact(q.Limit), q.Unit)}
	if q.Period == schemas.PeriodMinute {
		for _, m := range minutes {
			used.Points = append(used.Points, svgchart.Point{T: m.Minute, V: m.Value(q.Unit)})
		}
		c.Series, c.From, c.To = []svgchart.Series{used}, from, now
		return chartView{Title: title, Caption: "per minute, last " + s.cfg.ChartWindow.String(), SVG: c.SVG(), Points: c.PointCount()}
	}
	start := from
	if q.PeriodStart.After(start) {
		start = q.PeriodStart
	}
	sum := 0.0
	for _, m := range minutes {
		if !m.Minute.Before(start) {
			sum += m.Value(q.Unit)
		}
	}
	// What the period used before the chart's window.
	cum := math.Max(0, q.Used-sum)
	used.Points = append(used.Points, svgchart.Point{T: start, V: cum})
	for _, m := range minutes {
		if m.Minute.Before(start) {
			continue
		}
		// Flat until the minute begins, then its use over the minute: a
		// quiet stretch is drawn flat, not as a slope.
		used.Points = append(used.Points, svgchart.Point{T: m.Minute, V: cum})
		cum += m.Value(q.Unit)
		used.Points = append(used.Points, svgchart.Point{T: minTime(m.Minute.Add(time.Minute), now), V: cum})
	}
	used.Points = append(used.Points, svgchart.Point{T: now, V: q.Used})
	c.From, c.To = start, q.ResetsAt
	if q.ResetsAt.Sub(start) > 2*s.cfg.ChartWindow {
		c.To = now.Add(s.cfg.ChartWindow / 2)
	}
	fc := svgchart.Series{Name: "forecast", Dashed: true}
	caption := "no exhaustion predicted"
	switch {
	case q.PredictedExhaustion != nil && !q.PredictedExhaustion.After(c.To):
		end := *q.PredictedExhaustion
		if end.Before(now) {
			end = now
		}
		fc.Points = []svgchart.Point{{T: now, V: q.Used}, {T: end, V: math.Max(q.Limit, q.Used)}}
		caption = "exhaustion predicted " + until(now, q.PredictedExhaustion)
	case q.RatePerMinute > 0:
		fc.Points = []svgchart.Point{{T: now, V: q.Used}, {T: c.To, V: q.Used + q.RatePerMinute*c.To.Sub(now).Minutes()}}
		if q.PredictedExhaustion != nil {
			caption = "exhaustion predicted " + until(now, q.PredictedExhaustion)
		}
	}
	c.Series = []svgchart.Series{used, fc}
	return chartView{Title: title, Caption: fmt.Sprintf("%s of %s %s used; resets %s; %s", svgchart.Compact(q.Used), svgchart.Compact(q.Limit), q.Unit,
		until(now, &q.ResetsAt), caption), SVG: c.SVG(), Points: c.PointCount()}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// act posts one admin action to the enforcer with the session's token and
// comes back to the tenant page saying what happened; a refused action's
// form is shown again in place (formState).
func (s *server) act(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	back := "/tenants/" + url.PathEscape(tenant)
	sess := s.sessions.get(r)
	if sess == nil {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(back), http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, adminapi.MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	if !sess.mayAct() {
		s.fail(w, r, http.StatusForbidden, fmt.Sprintf("Your token (%s, %s) may not trip, reset, blacklist or override.", sess.who.Name, sess.who.Role))
		return
	}
	f := r.PostForm
	action := adminapi.Action(f.Get("action"))
	if !action.Valid() {
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Unknown action %q.", action))
		return
	}
	req := adminapi.Request{Tenant: tenant, Model: f.Get("model"), APIKeyID: strings.TrimSpace(f.Get("key")), Kind: flags.Kind(f.Get("kind")),
		Quota: schemas.QuotaKind(f.Get("quota")), Reason: strings.TrimSpace(f.Get("reason")), ExpiresIn: strings.TrimSpace(f.Get("expires"))}
	if req.Model == flags.AllModels {
		req.Model = ""
	}
	if v := strings.TrimSpace(f.Get("limit")); v != "" {
		l, err := strconv.ParseFloat(v, 64)
		if err != nil {
			s.showTenant(w, r, formState{Name: string(action), Values: f, Status: http.StatusUnprocessableEntity,
				Fields: map[string][]string{"limit": {fmt.Sprintf("limit: %q is not a number", v)}}})
			return
		}
		req.Limit = &l
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	res, err := sess.client.Do(ctx, action, req)
	if err != nil {
		s.showTenant(w, r, refusal(string(action), f, err, actInputs))
		return
	}
	s.log.Info("console: admin action done", "action", action, "tenant", tenant, "request_id", res.RequestID)
	http.Redirect(w, r, back+"?done="+url.QueryEscape(fmt.Sprintf("%s done (audit request %s)", action, res.RequestID)), http.StatusSeeOther)
}

// actInputs are the action forms' inputs, by the admin API's field names.
var actInputs = map[string]string{"model": "model", "api_key_id": "key", "kind": "kind", "quota": "quota", "limit": "limit",
	"expires_at": "expires", "expires_in": "expires", "reason": "reason"}

// tile is one figure of the pipeline page.
type tile struct {
	Name, Value, Detail string
	// Missing says why there is no figure.
	Missing string
	Chart   template.HTML
	Points  int
	// Max is the highest value of the history drawn.
	Max float64
}

// pipelinePage is the pipeline page's data.
type pipelinePage struct {
	Tiles       []tile
	Counted     chartView
	CountedErr  string
	SampleError string
	Source      string
}

func (s *server) pipeline(w http.ResponseWriter, r *http.Request) {
	samples, lastErr := s.sampler.snapshot()
	pg := pipelinePage{SampleError: lastErr, Source: "this process's metrics"}
	if len(s.cfg.MetricsURLs) > 0 {
		pg.Source = strings.Join(s.cfg.MetricsURLs, ", ")
	}
	pg.Tiles = pipelineTiles(samples)
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	now := s.now().UTC()
	if conn, err := s.ch.Get(ctx); err != nil {
		pg.CountedErr = err.Error()
	} else if ms, err := chstate.New(conn).Throughput(ctx, now.Add(-30*time.Minute).Truncate(time.Minute), now.Add(time.Minute)); err != nil {
		pg.CountedErr = err.Error()
	} else {
		ser := svgchart.Series{Name: "requests"}
		for _, m := range ms {
			ser.Points = append(ser.Points, svgchart.Point{T: m.Minute, V: m.Requests})
		}
		c := svgchart.Chart{Title: "Events counted per minute", Series: []svgchart.Series{ser}, From: now.Add(-30 * time.Minute), To: now}
		pg.Counted = chartView{Title: c.Title, Caption: "all tenants, last 30 minutes (ClickHouse usage_minute)", SVG: c.SVG(), Points: c.PointCount()}
	}
	s.render(w, r, "pipeline", http.StatusOK, pg)
}

// pipelineTiles derives the figures from the samples: rates and latencies
// between consecutive samples, the latest value in large, the history as
// a sparkline.
func pipelineTiles(samples []sample) []tile {
	rate := func(title, name string) tile {
		var ser svgchart.Series
		for i := 1; i < len(samples); i++ {
			a, b := samples[i-1], samples[i]
			dt := b.at.Sub(a.at).Seconds()
			if !a.complete || !b.complete || dt <= 0 {
				continue
			}
			ser.Points = append(ser.Points, svgchart.Point{T: b.at, V: math.Max(0, b.sums[name]-a.sums[name]) / dt})
		}
		return finish(tile{Name: title}, ser, name, func(v float64) string { return svgchart.Compact(v) + " events/s" })
	}
	gauge := func(title, name, unit string) tile {
		var ser svgchart.Series
		for _, sm := range samples {
			if v, ok := sm.sums[name]; ok {
				ser.Points = append(ser.Points, svgchart.Point{T: sm.at, V: v})
			}
		}
		return finish(tile{Name: title}, ser, name, func(v float64) string { return svgchart.Compact(v) + unit })
	}
	latency := func(title, name string, q float64) tile {
		t := tile{Name: title}
		if len(samples) == 0 {
			t.Missing = "no sample of the metrics yet"
			return t
		}
		last, ok := samples[len(samples)-1].hists[name]
		if !ok {
			t.Missing = "no data: no metrics endpoint read exports " + name
			return t
		}
		var ser svgchart.Series
		for i := 1; i < len(samples); i++ {
			a, oka := samples[i-1].hists[name]
			b, okb := samples[i].hists[name]
			if !oka || !okb {
				continue
			}
			if d := b.delta(a); d.count > 0 {
				ser.Points = append(ser.Points, svgchart.Point{T: samples[i].at, V: d.quantile(q) * 1000})
			}
		}
		// The figure: the observations of the sampled window, or every
		// one since the services started when the window has none.
		win, since := last, "since the services started"
		// The earliest sample that has the histogram: a service may have
		// registered it after the sampling began.
		for i, sm := range samples[:len(samples)-1] {
			if first, ok := sm.hists[name]; ok {
				if d := last.delta(first); d.count > 0 && d.count < last.count {
					win, since = d, "over the last "+span(samples[i:])
				}
				break
			}
		}
		if win.count <= 0 {
			t.Missing = "no observation yet (" + name + ")"
			return t
		}
		t.Value = svgchart.Compact(win.quantile(q)*1000) + " ms"
		t.Detail = fmt.Sprintf("p%.0f %s; mean %s ms over %.0f observations", q*100, since, svgchart.Compact(win.sum/win.count*1000), win.count)
		if len(ser.Points) > 0 {
			c := svgchart.Chart{Title: title, Series: []svgchart.Series{ser}}
			t.Chart, t.Points, t.Max = c.SVG(), c.PointCount(), maxOf(ser)
		}
		return t
	}
	return []tile{
		rate("Ingest rate", metricIngestEvents),
		gauge("Consumer lag", metricConsumerLag, " events"),
		latency("Flush latency", metricFlushSeconds, 0.99),
		latency("Enforcement lag", metricSignalLag, 0.99),
	}
}

func maxOf(ser svgchart.Series) float64 {
	m := 0.0
	for _, p := range ser.Points {
		m = math.Max(m, p.V)
	}
	return m
}

// finish sets a tile's value from its last point and draws its history,
// or says the metric was not found.
func finish(t tile, ser svgchart.Series, metric string, format func(float64) string) tile {
	if len(ser.Points) == 0 {
		t.Missing = "no data yet: " + metric + " has not been read twice from the metrics endpoints"
		return t
	}
	last := ser.Points[len(ser.Points)-1]
	t.Value = format(last.V)
	c := svgchart.Chart{Title: t.Name, Series: []svgchart.Series{ser}}
	t.Chart, t.Points, t.Max = c.SVG(), c.PointCount(), maxOf(ser)
	return t
}

// tiers are the tiers the overview filters by: any (0), then every alert
// tier the policy's tenants use (the built-in ones without a policy).
func (s *server) tiers() []int {
	var p *policy.Policy
	if s.policy != nil {
		p = s.policy.Current()
	}
	return append([]int{0}, p.AlertTiers()...)
}
