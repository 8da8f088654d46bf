package apikey

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func hash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func TestAuthenticateAndScope(t *testing.T) {
	set, err := Parse([]byte(fmt.Sprintf(`keys:
  - {id: gw-eu-1, sha256: %s, tenants: [acme, beta]}
  - {id: gw-any, sha256: %s, tenants: ["*"]}
`, hash("secret-1"), strings.ToUpper(hash("secret-2")))))
	if err != nil {
		t.Fatal(err)
	}
	id := set.Authenticate("secret-1")
	if id == nil || id.ID != "gw-eu-1" {
		t.Fatalf("secret-1 authenticated as %v, want gw-eu-1", id)
	}
	if !id.Allows("acme") || id.Allows("gamma") {
		t.Fatal("scoped key must allow acme and refuse gamma")
	}
	if any := set.Authenticate("secret-2"); any == nil || !any.Allows("gamma") {
		t.Fatal(`tenants: ["*"] key (upper-case hex) must allow any tenant`)
	}
	for _, bad := range []string{"", "secret", "secret-10", hash("secret-1")} {
		if set.Authenticate(bad) != nil {
			t.Fatalf("key %q authenticated", bad)
		}
	}
}

func TestParseNamesEveryProblem(t *testing.T) {
	_, err := Parse([]byte(`keys:
  - {id: a, sha256: zz}
  - {sha256: ` + hash("x") + `, tenants: [acme]}
  - {id: c, sha256: ` + hash("x") + `, tenants: [""]}
`))
	if err == nil {
		t.Fatal("invalid file accepted")
	}
	for _, want := range []string{"keys[0].sha256", "keys[1].id", "keys[2].tenants", "keys[2].sha256: same key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if _, err := Parse([]byte("keyz: []")); err == nil {
		t.Error("unknown top-level field accepted")
	}
}

// TestTenantsAreRequired: a key without tenants is refused with an error
// naming the key and both ways to fix it, instead of silently becoming a key
// for every tenant; "*" must stand alone.
func TestTenantsAreRequired(t *testing.T) {
	for name, tc := range map[string]struct {
		file string
		want []string
	}{
		"absent": {"keys: [{id: gw-eu-1, sha256: " + hash("a") + "}]",
			[]string{`keys[0].tenants: key "gw-eu-1" has no tenants`, `tenants: ["*"]`, "tenants: [acme, beta]"}},
		"empty": {"keys: [{id: gw-eu-1, sha256: " + hash("a") + ", tenants: []}]",
			[]string{`keys[0].tenants: key "gw-eu-1" has no tenants`}},
		"star with others": {"keys: [{id: gw-eu-1, sha256: " + hash("a") + `, tenants: ["*", acme]}]`,
			[]string{`keys[0].tenants: key "gw-eu-1" mixes "*"`}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil {
				t.Fatal("key without a clear tenant scope accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %s", err, w)
				}
			}
		})
	}
}

func TestRotationWithoutRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	write := func(content string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("keys: [{id: old, sha256: " + hash("old-key") + ", tenants: [acme]}]\n")
	reloads := make(chan error, 10)
	f, err := Open(path, slog.New(slog.DiscardHandler), func(err error) { reloads <- err })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.Watch(ctx, 10*time.Millisecond)

	if f.Authenticate("old-key") == nil {
		t.Fatal("old key refused before rotation")
	}
	write("keys: [{id: new, sha256: " + hash("new-key") + ", tenants: [acme]}, {id: newer, sha256: " + hash("newer-key") + ", tenants: [acme]}]\n")
	waitReload(t, reloads, false)
	if f.Authenticate("new-key") == nil || f.Authenticate("old-key") != nil {
		t.Fatal("rotation did not take effect")
	}
	// A broken edit keeps the previous keys in force.
	write("keys: [{id: broken, sha256: nothex}]\n")
	waitReload(t, reloads, true)
	if f.Authenticate("new-key") == nil {
		t.Fatal("a broken keys file locked out the previous keys")
	}
}

func waitReload(t *testing.T, reloads chan error, wantErr bool) {
	t.Helper()
	select {
	case err := <-reloads:
		if (err != nil) != wantErr {
			t.Fatalf("reload error = %v, want error: %v", err, wantErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("keys file change not picked up within 30s")
	}
}
