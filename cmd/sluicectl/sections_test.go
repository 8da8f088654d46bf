package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/adminapi"
)

// TestTenantsAndPlansCommandsSendEachVerb: the tenants and plans commands
// send each verb to its route with the section in canonical JSON, print
// the answer as a table or as JSON, and refuse a missing name or a bad -o
// before anything is sent.
func TestTenantsAndPlansCommandsSendEachVerb(t *testing.T) {
	var got []string
	var create adminapi.CreateSectionRequest
	var update adminapi.UpdateSectionRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		sec := adminapi.Section{Name: "blue", Body: json.RawMessage(`{"fail_mode":"closed"}`), Stamp: adminapi.Stamp{Version: 3, UpdatedBy: "ops"}}
		var answer any = adminapi.SectionResponse{Section: sec}
		switch r.Method {
		case http.MethodPost:
			if err := dec.Decode(&create); err != nil {
				t.Errorf("create body: %v", err)
			}
		case http.MethodPut:
			if err := dec.Decode(&update); err != nil {
				t.Errorf("update body: %v", err)
			}
		case http.MethodGet:
			if !strings.HasSuffix(r.URL.Path, "/blue") {
				answer = adminapi.SectionsResponse{Sections: []adminapi.Section{sec}}
			}
		}
		_ = json.NewEncoder(w).Encode(answer)
	}))
	defer srv.Close()
	run := func(kind adminapi.SectionKind, args ...string) (string, error) {
		var out bytes.Buffer
		err := runSectionsTo(context.Background(), kind, append(args, "-url", srv.URL, "-token", "tok"), &out)
		return out.String(), err
	}

	if out, err := run(adminapi.KindTenant, "create", "blue", "-from", "gold", "-body", "fail_mode: closed", "-reason", "new team"); err != nil ||
		!strings.Contains(out, "blue") || create.Name != "blue" || create.From != "gold" || string(create.Body) != `{"fail_mode":"closed"}` || create.Reason != "new team" {
		t.Fatalf("create: %v %q, sent %+v", err, out, create)
	}
	if _, err := run(adminapi.KindPlan, "update", "blue", "-version", "3", "-body", `{"fail_mode":"open"}`, "-reason", "r"); err != nil ||
		update.Version != 3 || string(update.Body) != `{"fail_mode":"open"}` {
		t.Fatalf("update: %v, sent %+v", err, update)
	}
	out, err := run(adminapi.KindPlan, "list", "-o", "json")
	var list adminapi.SectionsResponse
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.Sections) != 1 || list.Sections[0].Version != 3 {
		t.Fatalf("list -o json: %v %q", err, out)
	}
	if want := "POST /admin/v1/tenants PUT /admin/v1/plans/blue GET /admin/v1/plans"; strings.Join(got, " ") != want {
		t.Fatalf("requests %q, want %q", got, want)
	}
	if _, err := run(adminapi.KindTenant, "delete", "-version", "3", "-reason", "r"); err == nil ||
		err.Error() != "tenants delete: the name is required (sluicectl tenants delete NAME ...)" {
		t.Fatalf("delete without a name: %v", err)
	}
	if _, err := run(adminapi.KindTenant, "get", "blue", "-o", "yaml"); err == nil || !strings.Contains(err.Error(), `tenants: -o: "yaml" is not text or json`) {
		t.Fatalf("-o yaml: %v", err)
	}
	if len(got) != 3 {
		t.Fatalf("a refused command reached the server: %q", got)
	}
}
