package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const overlayFile = `
plans:
  gold:
    limits:
      rpm:
        unit: requests
        sliding_window: {length: 1m, limit: 100}
tenants:
  filed:
    plan: gold
`

func TestOverlaidAddsRecordsAndReportsConflicts(t *testing.T) {
	o := Overlay{
		Tenants: map[string]json.RawMessage{
			"api":   json.RawMessage(`{"plan":"gold","limits":{"rpm":{"sliding_window":{"limit":5}}}}`),
			"filed": json.RawMessage(`{"plan":"gold","timezone":"Europe/Paris"}`),
		},
		Plans: map[string]json.RawMessage{"silver": json.RawMessage(`{"mode":"soft"}`)},
	}
	p, conflicts, err := Overlaid([]byte(overlayFile), "p.yaml", o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(conflicts, []string{"tenants.filed"}) {
		t.Fatalf("conflicts = %v, want [tenants.filed]", conflicts)
	}
	api := p.Tenant("api")
	if !slices.Contains(p.TenantIDs(), "api") || api.Limits["rpm"].Max != 5 {
		t.Fatalf("tenant api from the record: %+v", api)
	}
	if p.Tenant("filed").Location != time.UTC {
		t.Fatalf("the file's definition of filed must be in force, got location %v", p.Tenant("filed").Location)
	}

	// Equal to the file's (as after sluicectl policy apply): no conflict.
	file, err := SectionsOf([]byte(overlayFile))
	if err != nil {
		t.Fatal(err)
	}
	o.Tenants["filed"] = file.Tenants["filed"]
	if _, conflicts, err = Overlaid([]byte(overlayFile), "p.yaml", o); err != nil || len(conflicts) != 0 {
		t.Fatalf("equal sections: conflicts %v, err %v", conflicts, err)
	}
}

// A file whose tenants share settings through YAML anchors, aliases and
// merge keys (<<) parses alone; laying a record over it used to fail with
// "unknown anchor", the file's sections being read one node at a time.
// They are read as the values the anchors stand for, and a record equal
// to such a tenant is no conflict.
func TestOverlaidReadsTheFilesAnchorsAndMergeKeys(t *testing.T) {
	file := []byte("tenants:\n  acme: &base\n    models:\n      \"*\": {monthly_tokens: 1000}\n" +
		"  beta:\n    <<: *base\n    timezone: Asia/Tokyo\n  gamma: *base\n")
	secs, err := SectionsOf(file)
	if err != nil {
		t.Fatal(err)
	}
	o := Overlay{Tenants: map[string]json.RawMessage{"newco": json.RawMessage(`{"timezone":"UTC"}`), "gamma": secs.Tenants["acme"]}}
	p, conflicts, err := Overlaid(file, "p.yaml", o)
	if err != nil || len(conflicts) != 0 {
		t.Fatalf("overlaid: conflicts %v, err %v", conflicts, err)
	}
	for _, id := range []string{"acme", "beta", "gamma"} {
		if q := p.Tenant(id).Quotas("*"); len(q) != 1 || q[0].Limit != 1000 {
			t.Errorf("tenant %s: quotas %+v; want the anchor's monthly 1000", id, q)
		}
	}
	if loc := p.Tenant("beta").Location.String(); loc != "Asia/Tokyo" {
		t.Errorf("beta's zone %s; want its own Asia/Tokyo beside the merged anchor", loc)
	}
	if !slices.Contains(p.TenantIDs(), "newco") {
		t.Errorf("the record tenant is missing: %v", p.TenantIDs())
	}
}

func TestOverlaidNamesTheRecordsBadField(t *testing.T) {
	o := Overlay{Tenants: map[string]json.RawMessage{"api": json.RawMessage(`{"burst_multiplier": 1000}`)}}
	_, _, err := Overlaid([]byte(overlayFile), "p.yaml", o)
	if err == nil || !strings.Contains(err.Error(), "tenants.api.burst_multiplier") {
		t.Fatalf("err = %v, want one naming tenants.api.burst_multiplier", err)
	}
}

// overlayWatcher watches overlayFile, written to a file of its own (its
// path returned for tests that edit it), reloaded only when told.
func overlayWatcher(t *testing.T) (string, *Watcher) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(overlayFile), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	return path, w
}

func TestWatcherOverlayKeepsTheLastGoodPolicy(t *testing.T) {
	path, w := overlayWatcher(t)
	good := Overlay{Tenants: map[string]json.RawMessage{"api": json.RawMessage(`{"plan":"gold"}`)}}
	if !w.SetOverlay(good) || !slices.Contains(w.Current().TenantIDs(), "api") {
		t.Fatal("a valid overlay must be installed")
	}
	if got := <-w.Subscribe(); !slices.Contains(got.TenantIDs(), "api") {
		t.Fatal("subscribers must get the overlaid policy")
	}
	bad := Overlay{Tenants: map[string]json.RawMessage{"api": json.RawMessage(`{"plan":"platinum"}`)}}
	if w.Check(bad) == nil {
		t.Fatal("Check must refuse a plan that does not exist")
	}
	// A record of a tenant the file defines is checked in the file's place.
	badFiled := Overlay{Tenants: map[string]json.RawMessage{"filed": json.RawMessage(`{"fail_mode":"shut"}`)}}
	if err := w.Check(badFiled); err == nil || !strings.Contains(err.Error(), "tenants.filed.fail_mode") {
		t.Fatalf("Check of a bad record of a tenant the file defines: %v; want tenants.filed.fail_mode named", err)
	}
	if w.SetOverlay(bad) || !slices.Contains(w.Current().TenantIDs(), "api") || w.LastError() == "" {
		t.Fatalf("an invalid overlay must keep the last good policy and say why (last error %q)", w.LastError())
	}
	// A file edit keeps the records laid over it.
	if err := os.WriteFile(path, []byte(overlayFile+"  other: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.SetOverlay(good)
	w.Reload()
	if ids := w.Current().TenantIDs(); !slices.Contains(ids, "other") || !slices.Contains(ids, "api") {
		t.Fatal("after a reload both the file's and the records' tenants must be in force")
	}
}

// BenchmarkOverlaid: what every service pays once per poll of the admin
// topic that changed a tenant or plan, with 10,000 tenants defined through
// the admin API (each its own section) over a small file, one of them
// changed from one call to the next: Overlaid alone, and a watcher's
// SetOverlay (the services' path).
func BenchmarkOverlaid(b *testing.B) {
	var two [2]Overlay
	for k := range two {
		two[k] = Overlay{Tenants: map[string]json.RawMessage{}}
		for i := range 10000 {
			two[k].Tenants[fmt.Sprintf("t%05d", i)] = json.RawMessage(fmt.Sprintf(`{"plan":"gold","limits":{"rpm":{"sliding_window":{"limit":%d}}},"models":{"*":{"daily_tokens":%d}}}`, 50+i%7, 100000+i))
		}
	}
	two[1].Tenants["t04242"] = json.RawMessage(`{"plan":"gold","models":{"*":{"daily_tokens":1}}}`)
	b.Run("Overlaid", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, _, err := Overlaid([]byte(overlayFile), "p.yaml", two[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("SetOverlay", func(b *testing.B) {
		w, err := FromData([]byte(overlayFile), "p.yaml")
		if err != nil {
			b.Fatal(err)
		}
		w.SetOverlay(two[1])
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if !w.SetOverlay(two[i%2]) {
				b.Fatal(w.LastError())
			}
		}
	})
}

// FileSections are the file's own sections as of the last reload: an edit
// on disk shows once reloaded, a content that does not parse leaves them
// as they were, and records laid over the file are not among them.
func TestWatcherFileSectionsFollowReloads(t *testing.T) {
	path, w := overlayWatcher(t)
	w.SetOverlay(Overlay{Tenants: map[string]json.RawMessage{"api": json.RawMessage(`{"plan":"gold"}`)}})
	names := func() string {
		o, err := w.FileSections()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(slices.Sorted(maps.Keys(o.Tenants)), ",") + "|" + strings.Join(slices.Sorted(maps.Keys(o.Plans)), ",")
	}
	if got := names(); got != "filed|gold" {
		t.Fatalf("sections of the file as loaded: %s", got)
	}
	if err := os.WriteFile(path, []byte(overlayFile+"  other: {plan: gold}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "filed|gold" {
		t.Fatalf("before the reload: %s", got)
	}
	if !w.Reload() {
		t.Fatal("the edit did not reload")
	}
	if got := names(); got != "filed,other|gold" {
		t.Fatalf("after the reload: %s", got)
	}
	if o, _ := w.FileSections(); string(o.Tenants["other"]) != `{"plan":"gold"}` {
		t.Fatalf("other's section: %s", o.Tenants["other"])
	}
	if err := os.WriteFile(path, []byte("tenants: [broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if w.Reload() || names() != "filed,other|gold" {
		t.Fatalf("a broken file must leave the sections in force: %s", names())
	}
	if o, err := Static(&Policy{}).FileSections(); err != nil || !o.Empty() {
		t.Fatalf("a static watcher's file sections: %+v, %v", o, err)
	}
}

// The records decoded apart and validated with the file make the policy
// the whole document merged as YAML and parsed makes, and a merge that
// does not validate fails with that document's errors, line for line.
func TestOverlaidDecodedApartIsTheMergedDocument(t *testing.T) {
	file := overlayFile + `channels:
  ops: {type: webhook, url: "https://hooks.example/ops"}
defaults:
  models:
    "*": {monthly_tokens: 1000000}
`
	rec := func(kv ...string) map[string]json.RawMessage {
		m := map[string]json.RawMessage{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = json.RawMessage(kv[i+1])
		}
		return m
	}
	example, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Every section of the example again as a record of another name:
	// limits, budgets, breakers, periods, channels and plans of records.
	copies := Overlay{Tenants: map[string]json.RawMessage{}, Plans: map[string]json.RawMessage{}}
	sections, err := SectionsOf(example)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range sections.Tenants {
		copies.Tenants["copy-"+name] = body
	}
	for name, body := range sections.Plans {
		copies.Plans["copy-"+name] = body
		copies.Tenants["of-copy-"+name] = json.RawMessage(`{"plan":"copy-` + name + `"}`)
	}
	for _, c := range []struct {
		name string
		file string
		o    Overlay
	}{
		{"the example's sections", string(example), copies},
		{"valid", file, Overlay{
			Tenants: rec("api", `{"plan":"silver","timezone":"Asia/Tokyo","channels":["ops"],"alert_tiers":[50,80],"models":{"*":{"daily_tokens":5}}}`,
				"filed", `{"plan":"gold"}`, "other", `{"budget":{"amount":10,"currency":"EUR"},"limits":{"rpm":{"unit":"requests","sliding_window":{"length":"1m","limit":3}}}}`,
				"nulled", `null`),
			Plans: rec("silver", `{"mode":"soft","models":{"*":{"monthly_tokens":7}}}`, "gold", `{"mode":"soft"}`)}},
		{"no tenants or plans in the file", "defaults:\n  mode: soft\n", Overlay{Tenants: rec("a", `{"plan":"p"}`), Plans: rec("p", `{}`)}},
		{"an empty file", "", Overlay{Tenants: rec("a", `{"timezone":"Europe/Paris"}`)}},
		{"tenants: left empty", "tenants:\nplans:\n", Overlay{Tenants: rec("a", `{}`)}},
		{"a merge key in the file", "limits:\n  a: &l {unit: requests, sliding_window: {length: 1m, limit: 3}}\n  b:\n    <<: *l\n", Overlay{Tenants: rec("a", `{}`)}},
		{"an unknown field", file, Overlay{Tenants: rec("a", `{"plan":"gold"}`, "b", `{"colour":"red"}`)}},
		{"a bad timezone and a missing plan", file, Overlay{Tenants: rec("a", `{"timezone":"Mars/Olympus"}`, "b", `{"plan":"platinum"}`)}},
		{"not an object", file, Overlay{Tenants: rec("a", `5`)}},
		{"empty", file, Overlay{Tenants: rec("a", ``)}},
		{"a duplicate key", file, Overlay{Tenants: rec("a", `{"plan":"gold","plan":"gold"}`)}},
		{"a bad name", file, Overlay{Tenants: rec("no spaces", `{}`)}},
		{"a plan taking a plan", file, Overlay{Plans: rec("p", `{"plan":"gold"}`)}},
		{"an unknown channel", file, Overlay{Tenants: rec("a", `{"channels":["pager"]}`)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sections, err := SectionsOf([]byte(c.file))
			if err != nil {
				t.Fatal(err)
			}
			laid, wantConflicts := recordsToLay(c.o, sections)
			want, wantErr := mergedYAML([]byte(c.file), "p.yaml", laid)
			// Apart, the merge finds something wrong exactly when the
			// document does (a merge key aside).
			_, apartErr := mergedDecoded([]byte(c.file), "p.yaml", laid, nil, options{})
			if (apartErr == nil) != (wantErr == nil && !strings.Contains(c.file, "<<")) {
				t.Fatalf("decoded apart: %v; the merged document: %v", apartErr, wantErr)
			}
			got, conflicts, err := Overlaid([]byte(c.file), "p.yaml", c.o)
			if fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("error:\n%v\nwant the merged document's:\n%v", err, wantErr)
			}
			if !slices.Equal(conflicts, wantConflicts) {
				t.Errorf("conflicts %v, want %v", conflicts, wantConflicts)
			}
			if wantErr != nil {
				return
			}
			want.fingerprint = got.fingerprint
			if !reflect.DeepEqual(got, want) {
				t.Errorf("the policy differs from the merged document's:\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// A watcher's merge decodes only the records that changed, and the
// policies it makes share nothing a reader could change under the next.
func TestWatcherOverlayDecodesChangedRecordsAlike(t *testing.T) {
	w, err := FromData([]byte(overlayFile), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := Overlay{Tenants: map[string]json.RawMessage{
		"a": json.RawMessage(`{"plan":"gold","alert_tiers":[10,20],"channels":["alertmanager"]}`),
		"b": json.RawMessage(`{"timezone":"Asia/Tokyo"}`),
	}}
	if !w.SetOverlay(o) {
		t.Fatal(w.LastError())
	}
	first := w.Current()
	first.tenants["a"].AlertTiers[0] = 99
	first.tenants["a"].Channels[0] = "changed"
	o2 := Overlay{Tenants: maps.Clone(o.Tenants)}
	o2.Tenants["b"] = json.RawMessage(`{"timezone":"Europe/Paris"}`)
	if !w.SetOverlay(o2) {
		t.Fatal(w.LastError())
	}
	want, _, err := Overlaid([]byte(overlayFile), "p.yaml", o2)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Current(); !reflect.DeepEqual(got, want) {
		t.Fatalf("the watcher's merge:\n%+v\nwant\n%+v", got, want)
	}
	if a := w.Current().Tenant("a"); a.AlertTiers[0] != 10 || a.Channels[0] != "alertmanager" {
		t.Fatalf("a changed through the previous policy: %v %v", a.AlertTiers, a.Channels)
	}
	if first.Fingerprint() == w.Current().Fingerprint() {
		t.Fatal("two overlays with one fingerprint")
	}
}
