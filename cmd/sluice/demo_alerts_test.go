package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"
)

// TestDemoShowsOnlyThisRunsAlerts: the Alertmanager of `make run` is
// shared, and an earlier run's alert for the same tenant keeps firing for
// minutes; the demo's view must not show it as this run's.
func TestDemoShowsOnlyThisRunsAlerts(t *testing.T) {
	since := time.Now()
	am := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v2/alerts" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `[
 {"labels":{"tenant":"runaway","alertname":"SluiceQuotaPredictedExhaustion","severity":"warning"},"startsAt":%q},
 {"labels":{"tenant":"runaway","alertname":"SluiceQuotaTier","severity":"critical"},"startsAt":%q},
 {"labels":{"tenant":"steady","alertname":"SluiceQuotaTier","severity":"warning"},"startsAt":%q}
]`, since.Add(-3*time.Minute).Format(time.RFC3339Nano), since.Add(time.Second).Format(time.RFC3339Nano), since.Add(-time.Minute).Format(time.RFC3339Nano))
	}))
	defer am.Close()

	s := &demoSource{alertmanager: am.URL, since: since}
	got := s.alerts(context.Background())
	want := map[string][]string{"runaway": {"SluiceQuotaTier/critical"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("alerts shown = %v, want only this run's %v", got, want)
	}
}
