package signalauth

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/schemas"
)

const (
	secretA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	secretB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func open(t *testing.T, c Config) *Auth {
	t.Helper()
	a, err := Open(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestSignVerify(t *testing.T) {
	a := open(t, Config{Keys: []string{"k1:" + secretA}})
	r := a.Record("signals", []byte("acme"), []byte(`{"kind":"period_reset"}`))
	if err := a.Verify(r); err != nil {
		t.Fatalf("a signed record: %v", err)
	}
	// Every signed part matters.
	for name, tamper := range map[string]func(r *kgo.Record){
		"value":  func(r *kgo.Record) { r.Value = []byte(`{"kind":"period_reset","x":1}`) },
		"key":    func(r *kgo.Record) { r.Key = []byte("other") },
		"schema": func(r *kgo.Record) { r.Headers[0].Value = []byte("some.other.schema") },
		"kid":    func(r *kgo.Record) { setHeader(r, HeaderKeyID, "k2") },
		"sig": func(r *kgo.Record) {
			s := []byte(header(r, HeaderSignature))
			s[0] ^= 1
			setHeader(r, HeaderSignature, string(s))
		},
		"sig not hex": func(r *kgo.Record) { setHeader(r, HeaderSignature, strings.Repeat("z", 64)) },
		"sig short":   func(r *kgo.Record) { setHeader(r, HeaderSignature, "00") },
		"two signatures": func(r *kgo.Record) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderSignature, Value: []byte("00")})
		},
		"two schemas": func(r *kgo.Record) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: schemas.HeaderSchema, Value: []byte("x")})
		},
		"unsigned": func(r *kgo.Record) { r.Headers = r.Headers[:1] },
	} {
		c := a.Record("signals", []byte("acme"), []byte(`{"kind":"period_reset"}`))
		tamper(c)
		if err := a.Verify(c); err == nil {
			t.Errorf("%s tampered: verified", name)
		}
	}
}

func TestWrongKeyAndUnsignedRefused(t *testing.T) {
	a := open(t, Config{Keys: []string{"k1:" + secretA}})
	forger := open(t, Config{Keys: []string{"k1:" + secretB}})
	r := forger.Record("t", []byte("acme"), []byte("{}"))
	if err := a.Verify(r); !errors.Is(err, ErrBadSignature) || Reason(err) != "bad_signature" {
		t.Errorf("signed with another secret under the same id: %v", err)
	}
	r = open(t, Config{Keys: []string{"k9:" + secretA}}).Record("t", []byte("acme"), []byte("{}"))
	if err := a.Verify(r); !errors.Is(err, ErrUnknownKey) || Reason(err) != "unknown_key" {
		t.Errorf("unknown key id: %v", err)
	}
	off := open(t, Config{Mode: ModeOff})
	r = off.Record("t", []byte("acme"), []byte("{}"))
	if err := a.Verify(r); !errors.Is(err, ErrUnsigned) || Reason(err) != "unsigned" {
		t.Errorf("unsigned: %v", err)
	}
	if err := off.Verify(r); err != nil {
		t.Errorf("mode off refused a record: %v", err)
	}
	var none *Auth
	if err := none.Verify(r); !errors.Is(err, ErrNotConfigured) {
		t.Errorf("nil Auth: %v, want ErrNotConfigured (fail closed)", err)
	}
}

// Rotation: verifiers holding old and new accept both; a signer switched
// to the new key is accepted by them; once the old key is removed its
// records are refused.
func TestKeyRotation(t *testing.T) {
	old := open(t, Config{Keys: []string{"2026-01:" + secretA}})
	both := open(t, Config{Keys: []string{"2026-01:" + secretA, "2026-02:" + secretB}})
	if both.signID != "2026-01" {
		t.Fatalf("sign key %q, want the first key", both.signID)
	}
	newSigner := open(t, Config{Keys: []string{"2026-01:" + secretA, "2026-02:" + secretB}, SignKey: "2026-02"})
	onlyNew := open(t, Config{Keys: []string{"2026-02:" + secretB}})

	fromOld := old.Record("t", []byte("acme"), []byte("{}"))
	fromNew := newSigner.Record("t", []byte("acme"), []byte("{}"))
	if header(fromNew, HeaderKeyID) != "2026-02" {
		t.Fatalf("kid %q, want 2026-02", header(fromNew, HeaderKeyID))
	}
	for _, r := range []*kgo.Record{fromOld, fromNew} {
		if err := both.Verify(r); err != nil {
			t.Errorf("verifier with both keys refused %s: %v", header(r, HeaderKeyID), err)
		}
	}
	if err := onlyNew.Verify(fromOld); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("old key removed, its record: %v, want ErrUnknownKey", err)
	}
	if err := onlyNew.Verify(fromNew); err != nil {
		t.Errorf("new key: %v", err)
	}
	// Re-signing replaces the signature instead of adding a second.
	newSigner.Sign(fromOld)
	if err := onlyNew.Verify(fromOld); err != nil {
		t.Errorf("re-signed with the new key: %v", err)
	}
}

func TestOpenConfigErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("# rotated 2026-11\n\nk1:"+secretA+"\n k2 : "+secretB+" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := open(t, Config{KeyFile: file})
	if len(a.keys) != 2 || a.signID != "k1" {
		t.Errorf("key file: ids %v sign %q", a.keys, a.signID)
	}
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{}, "signal_auth: no key"},
		{Config{Mode: "hmac"}, "signal_auth.mode: off"},
		{Config{Mode: "weak"}, `signal_auth.mode: "weak" is not hmac or off`},
		{Config{Keys: []string{"k1:short-secret"}}, "at least 32"},
		{Config{Keys: []string{"no-colon"}}, "want key_id:secret"},
		{Config{Keys: []string{"bad id:" + secretA}}, "key id"},
		{Config{Keys: []string{"k1:" + secretA, "k1:" + secretB}}, "given twice"},
		{Config{Keys: []string{"k1:" + secretA}, SignKey: "k2"}, `signal_auth.sign_key: "k2"`},
		{Config{KeyFile: filepath.Join(dir, "missing")}, "signal_auth.key_file"},
	} {
		_, err := Open(tc.c, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.c.Mode, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), secretA) || strings.Contains(err.Error(), "short-secret")) {
			t.Errorf("error shows a secret: %v", err)
		}
	}
}

func TestSecretsNeverLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if _, err := Open(Config{Keys: []string{"k1:" + secretA}}, log); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Mode: ModeOff}, log); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Contains(out, secretA) || !strings.Contains(out, "k1") || !strings.Contains(out, "mode is off") {
		t.Errorf("log:\n%s", out)
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func setHeader(r *kgo.Record, key, v string) {
	for i := range r.Headers {
		if r.Headers[i].Key == key {
			r.Headers[i].Value = []byte(v)
		}
	}
}

// TestSignalMACUnchanged pins the MAC of a signal: signals signed by a
// producer of an earlier release (before the other streams existed) must
// still verify after an upgrade of the consumers.
func TestSignalMACUnchanged(t *testing.T) {
	a := open(t, Config{Keys: []string{"k1:" + secretA}})
	r := a.Record("signals", []byte("acme"), []byte(`{"kind":"period_reset"}`))
	if got, want := header(r, HeaderSignature), "4235d4b1f6ed0af8fd684b994553f2832d8139e3994c38d7da700b8fef3ebe7f"; got != want {
		t.Fatalf("signal MAC %s, want %s: signals signed before this change would be refused", got, want)
	}
}

// TestStreamsAreSeparate: one key ring signs every stream, but a record
// signed for one stream verifies on no other, so a genuine signal (or
// alert state) copied onto the admin topic is refused; a tombstone is
// signed like any record, so a forged deletion is refused.
func TestStreamsAreSeparate(t *testing.T) {
	a := open(t, Config{Keys: []string{"k1:" + secretA}})
	streams := []Stream{Signals, AdminActions, AlerterState}
	for _, from := range streams {
		r := a.For(from).Record("t", []byte("acme\x00blacklist\x00*\x00"), []byte(`{"kind":"blacklist"}`))
		for _, to := range streams {
			err := a.For(to).Verify(r)
			if from == to && err != nil {
				t.Errorf("%s record refused by its own stream: %v", from, err)
			}
			if from != to && !errors.Is(err, ErrBadSignature) {
				t.Errorf("%s record verified as %s: %v", from, to, err)
			}
		}
	}
	if got := header(a.For(AdminActions).Record("t", nil, nil), schemas.HeaderSchema); got != schemas.SchemaAdminV1 {
		t.Errorf("admin record schema %q", got)
	}
	admin := a.For(AdminActions)
	lift := admin.Record("t", []byte("acme\x00blacklist\x00*\x00"), nil)
	if err := admin.Verify(lift); err != nil {
		t.Fatalf("a signed tombstone: %v", err)
	}
	forged := &kgo.Record{Key: []byte("initech\x00blacklist\x00*\x00"), Headers: lift.Headers}
	if err := admin.Verify(forged); !errors.Is(err, ErrBadSignature) {
		t.Errorf("a tombstone of another key under a copied signature: %v", err)
	}
	var none *Auth
	if none.For(AdminActions) != nil {
		t.Error("nil Auth For: not nil (would not fail closed)")
	}
}

// TestAdmitUnsignedState: accept_unsigned_state admits the unsigned
// records of the admin and alerter state streams (written before they were
// signed) and says so; it never admits an unsigned signal nor a badly
// signed record; without it Admit is Verify.
func TestAdmitUnsignedState(t *testing.T) {
	migrating := open(t, Config{Keys: []string{"k1:" + secretA}, AcceptUnsignedState: true})
	strict := open(t, Config{Keys: []string{"k1:" + secretA}})
	forger := open(t, Config{Keys: []string{"k1:" + secretB}})
	unsigned := &kgo.Record{Key: []byte("acme"), Value: []byte("{}")}
	for _, s := range []Stream{AdminActions, AlerterState} {
		if u, err := migrating.For(s).Admit(unsigned); !u || err != nil {
			t.Errorf("%s migrating, unsigned: %v %v, want admitted as unsigned", s, u, err)
		}
		if u, err := strict.For(s).Admit(unsigned); u || !errors.Is(err, ErrUnsigned) {
			t.Errorf("%s strict, unsigned: %v %v, want refused", s, u, err)
		}
		if u, err := migrating.For(s).Admit(forger.For(s).Record("t", []byte("acme"), []byte("{}"))); u || !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s migrating, forged: %v %v, want refused", s, u, err)
		}
		if u, err := migrating.For(s).Admit(migrating.For(s).Record("t", []byte("acme"), []byte("{}"))); u || err != nil {
			t.Errorf("%s migrating, signed: %v %v", s, u, err)
		}
	}
	if u, err := migrating.Admit(unsigned); u || !errors.Is(err, ErrUnsigned) {
		t.Errorf("signals migrating, unsigned: %v %v, want refused", u, err)
	}
}
