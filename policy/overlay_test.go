package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
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

func TestOverlaidNamesTheRecordsBadField(t *testing.T) {
	o := Overlay{Tenants: map[string]json.RawMessage{"api": json.RawMessage(`{"burst_multiplier": 1000}`)}}
	_, _, err := Overlaid([]byte(overlayFile), "p.yaml", o)
	if err == nil || !strings.Contains(err.Error(), "tenants.api.burst_multiplier") {
		t.Fatalf("err = %v, want one naming tenants.api.burst_multiplier", err)
	}
}

func TestWatcherOverlayKeepsTheLastGoodPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(overlayFile), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(overlayFile), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
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
