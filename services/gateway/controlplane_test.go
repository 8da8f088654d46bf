package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/services/enforcer"
)

// propagation is the bound the control plane promises (docs/controlplane.md):
// a key issued or revoked through the admin API is accepted or refused by
// every gateway following the admin topic within it.
const propagation = 5 * time.Second

// cpFleet is an enforcer and gateways sharing one admin topic, each
// restartable, for the control-plane tests.
type cpFleet struct {
	t        *testing.T
	ecfg     enforcer.Config
	eenv     platform.Env
	gcfg     Config
	genv     platform.Env
	operator string
}

func newFleet(t *testing.T) *cpFleet {
	kc, chc, rc := itest.Kafka(t), itest.ClickHouse(t), itest.Redis(t)
	ctx := context.Background()
	conn, err := chconn.Open(ctx, chc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	log := slog.New(slog.DiscardHandler)
	if _, err := migrations.Apply(ctx, conn, log); err != nil {
		t.Fatal(err)
	}
	auth := itest.SignalAuth(t)
	topics := itest.Topics(t)
	f := &cpFleet{t: t, operator: "op-" + itest.Unique(t, "")}
	f.ecfg = enforcer.DefaultConfig()
	f.ecfg.Group = itest.Unique(t, "enforcer_")
	f.ecfg.ReplicaID, f.ecfg.Admin.Listen = "test", "127.0.0.1:0"
	f.ecfg.Admin.Tokens = []adminapi.Token{{Name: "ops", SHA256: adminapi.HashToken(f.operator)}}
	f.eenv = platform.Env{Logger: log, Kafka: kc, Topics: topics, ClickHouse: chc, Redis: rc, SignalAuth: auth}

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	}))
	t.Cleanup(up.Close)
	tg := oneUpstream(t, up.URL+"/v1")
	tg.Listen, tg.FollowAdmin = "127.0.0.1:0", true
	f.gcfg = tg.Config
	f.genv = platform.Env{Logger: log, Redis: rc, Kafka: kc, Topics: topics, SignalAuth: auth,
		Policy:     platform.FileSource{File: tg.writePolicy(t), Reload: time.Second},
		TenantKeys: platform.FileSource{File: writeKeys(t), Reload: time.Second}}
	return f
}

// enforcer starts an enforcer and returns it with an operator's client.
func (f *cpFleet) enforcer() (*platform.Service, *adminapi.Client) {
	env := f.eenv
	env.Metrics, env.Health = prometheus.NewRegistry(), ops.NewHealth()
	svc, err := enforcer.New(f.ecfg, env.Named("enforcer"))
	itest.StartService(f.t, svc, err)
	c, err := adminapi.NewClient("http://"+svc.Addr(), f.operator, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return svc, c
}

// gateway starts a gateway and returns it with its metrics.
func (f *cpFleet) gateway() (*platform.Service, *prometheus.Registry) {
	env := f.genv
	reg := prometheus.NewRegistry()
	env.Metrics, env.Health = reg, ops.NewHealth()
	svc, err := New(f.gcfg, env)
	return itest.StartService(f.t, svc, err), reg
}

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

// status is what gateway g answers a chat call with key.
func status(t *testing.T, g *platform.Service, key string) int {
	resp, _ := post(t, "http://"+g.Addr(), "/v1/chat/completions", key, chatBody)
	return resp.StatusCode
}

// within waits until every gateway answers key with want, failing t past
// the propagation bound, and returns how long it took.
func within(t *testing.T, what string, want int, key string, gws ...*platform.Service) time.Duration {
	t.Helper()
	start := time.Now()
	itest.Eventually(t, propagation, what, func() bool {
		for _, g := range gws {
			if status(t, g, key) != want {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	t.Logf("%s: %s", what, took)
	return took
}

// TestKeysOfTheAdminAPIReachEveryGatewayWithinTheBound: a key issued
// through the enforcer's admin API is accepted by two gateways within 5 s,
// its rotation's overlap keeps the old secret working, its revocation is
// refused by both within 5 s; a gateway restarted, and then the enforcer
// restarted, still know it — the state lives on the admin topic.
func TestKeysOfTheAdminAPIReachEveryGatewayWithinTheBound(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	f := newFleet(t)
	ctx := context.Background()
	enf, admin := f.enforcer()
	gwA, _ := f.gateway()
	gwB, _ := f.gateway()

	issued, err := admin.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "acme", Name: "batch", Models: []string{"gpt-4o-mini"}, Reason: "onboarding"})
	if err != nil {
		t.Fatal(err)
	}
	if issued.Secret == "" || issued.Key.Version != 1 {
		t.Fatalf("issued %+v", issued)
	}
	within(t, "issued key accepted by both gateways", http.StatusOK, issued.Secret, gwA, gwB)

	rotated, err := admin.RotateKey(ctx, issued.Key.ID, adminapi.RotateKeyRequest{Version: 1, Overlap: "1h", Reason: "yearly rotation"})
	if err != nil {
		t.Fatal(err)
	}
	within(t, "rotated secret accepted by both gateways", http.StatusOK, rotated.Secret, gwA, gwB)
	for _, g := range []*platform.Service{gwA, gwB} {
		if got := status(t, g, issued.Secret); got != http.StatusOK {
			t.Fatalf("the old secret, within its hour of overlap: %d; want 200", got)
		}
	}

	// A gateway restarted knows the key from the topic before it serves.
	if err := gwA.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	gwA, _ = f.gateway()
	if got := status(t, gwA, rotated.Secret); got != http.StatusOK {
		t.Fatalf("a restarted gateway answers the rotated key %d; want 200 at once", got)
	}
	// So does a restarted enforcer, which refuses a change that read a
	// version older than the topic's.
	if err := enf.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, admin = f.enforcer()
	k, err := admin.Key(ctx, issued.Key.ID)
	if err != nil || k.Version != 2 || k.PreviousFingerprint == "" {
		t.Fatalf("after the enforcer's restart: %+v, %v; want version 2 with the old secret in its overlap", k, err)
	}
	var stale *adminapi.Error
	if _, err := admin.RevokeKey(ctx, k.ID, adminapi.RevokeKeyRequest{Version: 1, Reason: "leaked"}); !errors.As(err, &stale) || stale.StatusCode != http.StatusConflict {
		t.Fatalf("a revocation that read version 1 of a version-2 key: %v; want 409", err)
	}
	if _, err := admin.RevokeKey(ctx, k.ID, adminapi.RevokeKeyRequest{Version: 2, Reason: "leaked"}); err != nil {
		t.Fatal(err)
	}
	within(t, "revoked key refused by both gateways", http.StatusUnauthorized, rotated.Secret, gwA, gwB)
	within(t, "revoked key's old secret refused by both gateways", http.StatusUnauthorized, issued.Secret, gwA, gwB)
	// The keys file's keys never stopped working.
	if got := status(t, gwB, "sk-acme"); got != http.StatusOK {
		t.Fatalf("the keys file's key sk-acme: %d", got)
	}

	trail, err := admin.KeyAudit(ctx, k.ID)
	if err != nil {
		t.Fatal(err)
	}
	var actions []adminapi.Action
	for _, e := range trail {
		actions = append(actions, e.Action)
		if e.Actor != "ops" || len(e.Changes) == 0 {
			t.Errorf("audit entry %+v: want actor ops and the fields it changed", e)
		}
	}
	if len(actions) != 3 || actions[0] != adminapi.ActionKeyIssue || actions[1] != adminapi.ActionKeyRotate || actions[2] != adminapi.ActionKeyRevoke {
		t.Fatalf("audit trail %v; want issue, rotate, revoke", actions)
	}
}

// TestAKeyIDInTheFileAndTheAPIIsAConflictNotAnOverride: the admin API
// issues a key under an id the keys file has; no gateway accepts the API's
// key, the file's key keeps working, and the conflict is counted until a
// reload of the file removes its entry.
func TestAKeyIDInTheFileAndTheAPIIsAConflictNotAnOverride(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	f := newFleet(t)
	ctx := context.Background()
	_, admin := f.enforcer()
	gw, reg := f.gateway()
	dup, err := admin.IssueKey(ctx, adminapi.IssueKeyRequest{ID: "acme", Tenant: "other", Models: []string{"*"}, Reason: "clash"})
	if err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, propagation, "the conflict counted", func() bool { return itest.GaugeValue(t, reg, "sluice_gateway_key_conflicts") == 1 })
	if got := status(t, gw, dup.Secret); got != http.StatusUnauthorized {
		t.Fatalf("the API's key under the file's id: %d; want 401", got)
	}
	if got := status(t, gw, "sk-acme"); got != http.StatusOK {
		t.Fatalf("the file's key acme: %d; want 200", got)
	}
	// The file's entry removed, its next reload ends the conflict: the
	// API's key is accepted, the file's secret no longer.
	keys := "keys:\n" + frontend.KeyLine("boss", "sk-boss", "acme", nil)
	if err := os.WriteFile(f.genv.TenantKeys.File, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 30*time.Second, "the reloaded keys file ending the conflict", func() bool {
		return itest.GaugeValue(t, reg, "sluice_gateway_key_conflicts") == 0
	})
	if got := status(t, gw, dup.Secret); got != http.StatusOK {
		t.Fatalf("the API's key once the file no longer has its id: %d; want 200", got)
	}
	if got := status(t, gw, "sk-acme"); got != http.StatusUnauthorized {
		t.Fatalf("the removed file key: %d; want 401", got)
	}
}
