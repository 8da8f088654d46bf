package admission

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// The shared test vectors: testdata/vectors.json holds rules, admissions,
// settlements and the decision each admission must give. The Python SDK
// runs the same file (sdk/python/tests/test_vectors.py), so both SDKs
// name a limit the same way and share their counters key for key.

type vectorFile struct {
	Cases []vectorCase `json:"cases"`
}

type vectorCase struct {
	Name  string      `json:"name"`
	Rules vectorRules `json:"rules"`
	// Policy names a policy file of policy/testdata whose rules the case
	// runs instead of Rules: here, what policy.AdmissionRules makes of it as
	// policy/testdata/admission.rules.json records it (the policy package
	// imports this one, and TestAdmissionRulesGolden keeps that file true);
	// the Python SDK reads the policy file itself (sluice.policy).
	Policy string       `json:"policy"`
	Steps  []vectorStep `json:"steps"`
	Keys   []string     `json:"keys"`
}

type vectorRules struct {
	Shared  []vectorRule           `json:"shared"`
	Tenants map[string]vectorOwner `json:"tenants"`
	Default vectorOwner            `json:"default"`
}

type vectorOwner struct {
	Rules    []vectorRule `json:"rules"`
	FailMode string       `json:"fail_mode"`
}

type vectorRule struct {
	Name      string            `json:"name"`
	Scope     map[string]string `json:"scope"`
	Unit      string            `json:"unit"`
	Algorithm string            `json:"algorithm"`
	Limit     int64             `json:"limit"`
	WindowMs  int64             `json:"window_ms"`
	Rate      float64           `json:"rate_per_second"`
	Exact     bool              `json:"exact"`
	Reserve   float64           `json:"reserve"`
}

type vectorStep struct {
	Admit *struct {
		ID               string `json:"id"`
		Tenant           string `json:"tenant"`
		Model            string `json:"model"`
		User             string `json:"user"`
		Key              string `json:"key"`
		Endpoint         string `json:"endpoint"`
		Upstream         string `json:"upstream"`
		Priority         string `json:"priority"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
	} `json:"admit"`
	As               string        `json:"as"`
	Expect           *vectorExpect `json:"expect"`
	Settle           string        `json:"settle"`
	PromptTokens     int64         `json:"prompt_tokens"`
	CompletionTokens int64         `json:"completion_tokens"`
	Copy             bool          `json:"copy"`
}

type vectorExpect struct {
	Allowed      bool              `json:"allowed"`
	Rule         *string           `json:"rule"`
	Scope        map[string]string `json:"scope"`
	Unit         *string           `json:"unit"`
	Algorithm    *string           `json:"algorithm"`
	Limit        *int64            `json:"limit"`
	Requested    *int64            `json:"requested"`
	Available    *int64            `json:"available"`
	TooLarge     *bool             `json:"too_large"`
	Message      *string           `json:"message"`
	RetryAfterMs []int64           `json:"retry_after_ms"`
	Requests     *vectorHeadroom   `json:"requests"`
	Tokens       *vectorHeadroom   `json:"tokens"`
}

type vectorHeadroom struct {
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
}

func (r vectorRule) rule(t *testing.T) Rule {
	t.Helper()
	u, ok := ParseUnit(r.Unit)
	if !ok {
		t.Fatalf("rule %s: unit %q", r.Name, r.Unit)
	}
	out := Rule{Name: r.Name, Unit: u, Limit: r.Limit, Window: time.Duration(r.WindowMs) * time.Millisecond, Rate: r.Rate,
		Exact: r.Exact, Reserve: r.Reserve}
	switch r.Algorithm {
	case "token_bucket":
		out.Algorithm = TokenBucket
	case "sliding_window":
		out.Algorithm = SlidingWindow
	default:
		t.Fatalf("rule %s: algorithm %q", r.Name, r.Algorithm)
	}
	// The vectors name the dimensions as Scope does in keys and messages.
	dims := out.Scope.dims()
	for d, v := range r.Scope {
		i := slices.IndexFunc(dims[:], func(dim scopeDim) bool { return dim.name == d })
		if i < 0 {
			t.Fatalf("rule %s: scope dimension %q", r.Name, d)
		}
		*dims[i].v = v
	}
	return out
}

func (v vectorRules) rules(t *testing.T) *Rules {
	t.Helper()
	owner := func(o vectorOwner) TenantRules {
		tr := TenantRules{FailMode: FailMode(o.FailMode)}
		for _, r := range o.Rules {
			tr.Rules = append(tr.Rules, r.rule(t))
		}
		return tr
	}
	rs := &Rules{Tenants: map[string]TenantRules{}, Default: owner(v.Default)}
	for _, r := range v.Shared {
		rs.Shared = append(rs.Shared, r.rule(t))
	}
	for id, o := range v.Tenants {
		rs.Tenants[id] = owner(o)
	}
	return rs
}

// TestSharedVectors runs testdata/vectors.json against the real Redis.
func TestSharedVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var f vectorFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) == 0 {
		t.Fatal("no cases in testdata/vectors.json")
	}
	for _, c := range f.Cases {
		if c.Policy != "" {
			c.Rules = policyRules(t, c.Policy)
		}
		t.Run(c.Name, func(t *testing.T) {
			client := testClient(t, "")
			prefix := testPrefix(t)
			// Every rule exact and no refusal cache: Redis decides each
			// admission, as it does for every SDK.
			l := newTestLimiter(t, client, c.Rules.rules(t), WithPrefix(prefix), WithLeaseFraction(0), WithRefusalCache(0))
			ctx := context.Background()
			tickets := map[string]*Ticket{}
			originals := map[string]Ticket{}
			for i, s := range c.Steps {
				switch {
				case s.Admit != nil:
					a := s.Admit
					tk := mustAdmit(t, l, Request{ID: a.ID, Tenant: a.Tenant, Model: a.Model, User: a.User, Key: a.Key,
						Endpoint: a.Endpoint, Upstream: a.Upstream, Priority: schemas.Priority(a.Priority),
						PromptTokens: a.PromptTokens, CompletionTokens: a.CompletionTokens})
					if s.As != "" {
						tickets[s.As] = &tk
						originals[s.As] = tk
					}
					if s.Expect != nil {
						checkVector(t, i, tk.Decision, s.Expect)
					}
				case s.Settle != "":
					tk := tickets[s.Settle]
					if s.Copy {
						cp := originals[s.Settle]
						tk = &cp
					}
					if tk == nil {
						t.Fatalf("step %d: no ticket %q", i, s.Settle)
					}
					if err := tk.Settle(ctx, Usage{PromptTokens: s.PromptTokens, CompletionTokens: s.CompletionTokens}); err != nil {
						t.Fatalf("step %d: settle: %v", i, err)
					}
				default:
					t.Fatalf("step %d: neither admit nor settle", i)
				}
			}
			for _, k := range c.Keys {
				if n, err := client.Exists(ctx, prefix+k).Result(); err != nil || n != 1 {
					t.Errorf("key %q: exists %d, %v", prefix+k, n, err)
				}
			}
		})
	}
}

// policyRules returns the admission rules of policy/testdata/<name> as
// policy/testdata/admission.rules.json records them.
func policyRules(t *testing.T, name string) vectorRules {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "policy", "testdata", "admission.rules.json"))
	if err != nil {
		t.Fatal(err)
	}
	var golden struct {
		Files map[string]struct {
			Admission vectorRules `json:"admission"`
		} `json:"files"`
	}
	if err := json.Unmarshal(raw, &golden); err != nil {
		t.Fatal(err)
	}
	f, ok := golden.Files[name]
	if !ok {
		t.Fatalf("policy %s: not in policy/testdata/admission.rules.json", name)
	}
	return f.Admission
}

func checkVector(t *testing.T, step int, d Decision, e *vectorExpect) {
	t.Helper()
	msg := Error(d).Message
	if d.Allowed != e.Allowed {
		t.Fatalf("step %d: allowed %v, want %v (%s)", step, d.Allowed, e.Allowed, msg)
	}
	eq := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("step %d: %s = %v, want %v", step, what, got, want)
		}
	}
	if e.Rule != nil {
		eq("rule", d.Rule, *e.Rule)
	}
	if e.Scope != nil {
		got, _ := json.Marshal(scopeMap(d.Scope))
		want, _ := json.Marshal(e.Scope)
		eq("scope", string(got), string(want))
	}
	if e.Unit != nil {
		eq("unit", d.Unit.String(), *e.Unit)
	}
	if e.Algorithm != nil {
		eq("algorithm", d.Algorithm.String(), *e.Algorithm)
	}
	if e.Limit != nil {
		eq("limit", d.Limit, *e.Limit)
	}
	if e.Requested != nil {
		eq("requested", d.Requested, *e.Requested)
	}
	if e.Available != nil {
		eq("available", d.Available, *e.Available)
	}
	if e.TooLarge != nil {
		eq("too_large", d.Never, *e.TooLarge)
	}
	if len(e.RetryAfterMs) == 2 {
		ms := d.RetryAfter.Milliseconds()
		if ms < e.RetryAfterMs[0] || ms > e.RetryAfterMs[1] {
			t.Errorf("step %d: retry after %dms, want %d..%d", step, ms, e.RetryAfterMs[0], e.RetryAfterMs[1])
		}
	}
	if e.Message != nil {
		eq("message", msg, strings.ReplaceAll(*e.Message, "{retry}", ratelimit.FormatReset(d.RetryAfter)))
	}
	if e.Requests != nil {
		eq("requests headroom", [2]int64{d.Requests.Limit, d.Requests.Remaining}, [2]int64{e.Requests.Limit, e.Requests.Remaining})
	}
	if e.Tokens != nil {
		eq("tokens headroom", [2]int64{d.Tokens.Limit, d.Tokens.Remaining}, [2]int64{e.Tokens.Limit, e.Tokens.Remaining})
	}
}
