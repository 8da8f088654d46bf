package policy

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/sdk/go/admission"
)

var update = flag.Bool("update", false, "rewrite testdata/admission.rules.json from the policy files")

// goldenPolicies are the policy files whose rules testdata/admission.rules.json
// holds.
var goldenPolicies = []string{"admission.yaml", "example.yaml"}

// TestAdmissionRulesGolden pins AdmissionRules and SoftLimitRules of the
// test policies in testdata/admission.rules.json, in the JSON form of the
// shared admission vectors. The Python SDK's policy loader
// (sdk/python/sluice/policy.py) is checked against the same file
// (sdk/python/tests/test_policy.py), so a Python gateway reading the policy
// file enforces the same rules, under the same names, as a Go one.
func TestAdmissionRulesGolden(t *testing.T) {
	got := map[string]map[string]rulesJSON{}
	for _, name := range goldenPolicies {
		p, err := Load(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		got[name] = map[string]rulesJSON{"admission": toRulesJSON(p.AdmissionRules()), "soft": toRulesJSON(p.SoftLimitRules())}
	}
	out, err := json.MarshalIndent(map[string]any{
		"about": "AdmissionRules and SoftLimitRules of each policy file, in the rules' JSON form (sdk/go/admission/testdata/vectors.json). Written by go test ./policy -run TestAdmissionRulesGolden -update; checked in Go and by sdk/python/tests/test_policy.py.",
		"files": got,
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, '\n')
	golden := filepath.Join("testdata", "admission.rules.json")
	if *update {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(out) {
		t.Errorf("%s is not what AdmissionRules makes of %v (run with -update if the change is meant, then the Python tests):\n%s", golden, goldenPolicies, out)
	}
}

type ruleJSON struct {
	Name      string            `json:"name"`
	Scope     map[string]string `json:"scope"`
	Unit      string            `json:"unit"`
	Algorithm string            `json:"algorithm"`
	Limit     int64             `json:"limit"`
	WindowMs  *int64            `json:"window_ms,omitempty"`
	Rate      *float64          `json:"rate_per_second,omitempty"`
	Exact     bool              `json:"exact"`
	Reserve   float64           `json:"reserve"`
}

type ownerJSON struct {
	Rules    []ruleJSON `json:"rules"`
	FailMode string     `json:"fail_mode"`
}

type rulesJSON struct {
	Shared  []ruleJSON           `json:"shared"`
	Tenants map[string]ownerJSON `json:"tenants"`
	Default ownerJSON            `json:"default"`
}

func toRulesJSON(rs *admission.Rules) rulesJSON {
	list := func(rules []admission.Rule) []ruleJSON {
		out := []ruleJSON{}
		for _, r := range rules {
			j := ruleJSON{Name: r.Name, Scope: map[string]string{}, Unit: r.Unit.String(), Algorithm: r.Algorithm.String(),
				Limit: r.Limit, Exact: r.Exact, Reserve: r.Reserve}
			for d, v := range map[string]string{"upstream": r.Scope.Upstream, "tenant": r.Scope.Tenant, "model": r.Scope.Model,
				"user": r.Scope.User, "key": r.Scope.Key, "endpoint": r.Scope.Endpoint} {
				if v != "" {
					j.Scope[d] = v
				}
			}
			if r.Algorithm == admission.SlidingWindow {
				ms := r.Window.Milliseconds()
				j.WindowMs = &ms
			} else {
				rate := r.Rate
				j.Rate = &rate
			}
			out = append(out, j)
		}
		return out
	}
	out := rulesJSON{Shared: list(rs.Shared), Tenants: map[string]ownerJSON{},
		Default: ownerJSON{Rules: list(rs.Default.Rules), FailMode: string(rs.Default.FailMode)}}
	for id, tr := range rs.Tenants {
		out.Tenants[id] = ownerJSON{Rules: list(tr.Rules), FailMode: string(tr.FailMode)}
	}
	return out
}
