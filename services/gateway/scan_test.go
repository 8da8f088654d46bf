package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/policy"
)

// TestScanRequestAndIncludeUsage: the top-level members are found
// wherever they are; asking for usage adds or completes stream_options
// and leaves every other member as it was.
func TestScanRequestAndIncludeUsage(t *testing.T) {
	for _, body := range []string{
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"a \"quoted\" {brace} [x]"}]}`,
		`  { "messages" : [ {"content": "model: \"no\""} ] , "stream" : true , "model" : "gpt-4o" , "user": "u1" }  `,
		`{"model":"gpt-4o","stream":true,"stream_options":{"include_obfuscation":false},"messages":[]}`,
		`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false},"n":2}`,
	} {
		req, err := scanRequest([]byte(body))
		if err != nil || req.Model != "gpt-4o" || !req.Stream || req.IncludeUsage {
			t.Fatalf("%s: %+v %v", body, req, err)
		}
		out := withIncludeUsage([]byte(body), req)
		var before, after map[string]any
		if err := json.Unmarshal([]byte(body), &before); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("%s became invalid JSON %s: %v", body, out, err)
		}
		so, _ := after["stream_options"].(map[string]any)
		if so["include_usage"] != true {
			t.Errorf("%s: stream_options %v", out, after["stream_options"])
		}
		if b, ok := before["stream_options"].(map[string]any); ok && b["include_obfuscation"] != nil && so["include_obfuscation"] != false {
			t.Errorf("%s: the client's other stream options were lost", out)
		}
		delete(after, "stream_options")
		delete(before, "stream_options")
		bb, _ := json.Marshal(before)
		ab, _ := json.Marshal(after)
		if string(bb) != string(ab) {
			t.Errorf("members changed: %s -> %s", bb, ab)
		}
		if req2, _ := scanRequest(out); !req2.IncludeUsage {
			t.Errorf("%s does not ask for usage when read again", out)
		}
	}
	if req, _ := scanRequest([]byte(`{"model":"m","user":"u-9"}`)); req.User != "u-9" {
		t.Errorf("user %q", req.User)
	}
	for _, bad := range []string{``, `[]`, `{"model":}`, `{"model":"x"`, `{"model":1}`, `{"a":"\"}`, `{"a":1}x`, strings.Repeat("[", 200)} {
		if _, err := scanRequest([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestScanRequestRefusesAmbiguousNames: names are decoded; a top-level
// member named twice (ignoring case, as Go decoders match, the Kelvin sign
// included), or one the gateway reads spelt in another case, is refused —
// among a few members or many.
func TestScanRequestRefusesAmbiguousNames(t *testing.T) {
	if req, err := scanRequest([]byte(`{"mod\u0065l":"gpt-4o","stre\u0061m":true,"\u0075ser":"u"}`)); err != nil || req.Model != "gpt-4o" || !req.Stream || req.User != "u" {
		t.Fatalf("escaped names: %+v %v", req, err)
	}
	many := strings.Builder{}
	for i := range 100 {
		fmt.Fprintf(&many, `"k%d":1,`, i)
	}
	for _, body := range []string{
		`{"model":"a","mod\u0065l":"b"}`,
		`{"model":"a","MODEL":"b"}`,
		`{"Model":"a"}`,
		`{"model":"a","max_tokens":1,"Max_Tokens":9}`,
		`{"model":"a","temperature":1,"temperature":2}`,
		`{"model":"a","\u212aey":1,"key":2}`,
		`{"model":"a","stream":"true"}`,
		`{"model":"a","stream":1}`,
		`{"model":"a",` + many.String() + `"K99":2}`,
		`{"model":"a",` + many.String() + `"mod\u0065l":"b"}`,
	} {
		if _, err := scanRequest([]byte(body)); err == nil {
			t.Errorf("%.60s… accepted", body)
		}
	}
	if _, err := scanRequest([]byte(`{"model":"a",` + many.String() + `"k100":2}`)); err != nil {
		t.Errorf("100 distinct members: %v", err)
	}
}

func FuzzScanRequest(f *testing.F) {
	for _, s := range []string{`{"model":"gpt-4o","stream":true,"messages":[{"content":"x"}]}`, `{"stream_options":{"a":1},"model":"m"}`, `{}`, `{"a":[1,{"b":null}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := scanRequest(b)
		if err != nil {
			return
		}
		out := withIncludeUsage(b, req)
		if json.Valid(b) && !json.Valid(out) {
			t.Fatalf("valid %q became invalid %q", b, out)
		}
	})
}

// TestKeysFileNamesEveryProblem: the gateway's keys file shares ingest's
// hashing and checks, and adds its own, each naming entry and field.
func TestKeysFileNamesEveryProblem(t *testing.T) {
	h := strings.Repeat("a", 64)
	_, err := frontend.ParseKeys([]byte(`keys:
  - {id: a, sha256: ` + h + `, models: ["*"]}
  - {id: b, sha256: ` + strings.Repeat("b", 64) + `, tenant: "no spaces", models: ["*"]}
  - {id: c, sha256: ` + strings.Repeat("c", 64) + `, tenant: acme}
  - {id: d, sha256: ` + h + `, tenant: acme, models: ["*", gpt-4o], priority: urgent, class: "a b"}
  - {id: e, sha256: nothex, tenant: acme, models: ["*"]}
`))
	for _, want := range []string{"keys[0].tenant", "keys[1]: key \"b\"", "keys[2].models", `keys[3].models: key "d" mixes`,
		"keys[3]: key \"d\"", "keys[3].class", "keys[3].sha256: same key as \"a\"", "keys[4].sha256"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

// TestConfigErrorsNameTheSetting: a broken configuration is refused with
// every problem named by its path, and the credential is read from its
// environment variable, never the configuration.
func TestConfigErrorsNameTheSetting(t *testing.T) {
	c := DefaultConfig()
	c.Usage.Sink = "carrier-pigeon"
	c.MaxAttempts = 0
	c.SharedUpstreams.RedisTimeout = time.Minute
	err := c.Validate()
	for _, want := range []string{"usage.sink", "max_attempts", "shared_upstreams.redis_timeout: 1m0s is outside 1ms..10s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to name %s", err, want)
		}
	}
}

// TestUpstreamCredentials: an upstream's API key is read from the
// environment variable or the file its policy entry names, never from the
// policy itself; one that cannot be read keeps the gateway from starting,
// naming the upstream and the setting.
func TestUpstreamCredentials(t *testing.T) {
	t.Setenv("SLUICE_TEST_PROVIDER_KEY", "sk-provider")
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for env, file := range map[string]string{"SLUICE_TEST_PROVIDER_KEY": "", "": key} {
		pv, err := newProvider(policy.Upstream{Name: "u", APIKeyEnv: env, APIKeyFile: file})
		if err != nil || !strings.HasPrefix(pv.key, "sk-") || strings.ContainsAny(pv.key, "\n ") {
			t.Errorf("credential from env %q file %q: %v %v", env, file, pv, err)
		}
	}
	tg := testConfig(t, Upstream{Name: "openai", BaseURL: "https://api.example.com/v1", Models: []string{"*"}})
	tg.policy = "upstreams:\n  openai: {api_key_env: SLUICE_TEST_SURELY_UNSET}\n"
	keys, err := frontend.OpenKeys(writeKeys(t), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := tg.parsePolicy(t)
	_, err = NewServer(tg.Config, Deps{Keys: keys, Policy: func() *policy.Policy { return p }, Guards: NewGuards(nil, "", "test", nil, nil)})
	if err == nil || !strings.Contains(err.Error(), "upstreams.openai.api_key_env: environment variable SLUICE_TEST_SURELY_UNSET") {
		t.Fatalf("New with an unreadable credential: %v", err)
	}
}
