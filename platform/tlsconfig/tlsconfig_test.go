package tlsconfig_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// writeServerCA writes the certificate of srv (self-signed, so its own CA)
// as PEM and returns the path.
func writeServerCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// otherCA writes a freshly generated self-signed CA certificate as PEM.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBuildVerifiesAgainstCAFile: the built config trusts exactly ca_file:
// a handshake with the server it signed succeeds, with another CA it fails.
func TestBuildVerifiesAgainstCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	tc, err := tlsconfig.Config{Enabled: true, CAFile: writeServerCA(t, srv), ServerName: "example.com"}.Build("x.tls")
	if err != nil {
		t.Fatal(err)
	}
	if tc.MinVersion < tls.VersionTLS12 {
		t.Errorf("MinVersion = %x, want at least TLS 1.2", tc.MinVersion)
	}
	conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), tc)
	if err != nil {
		t.Fatalf("handshake with the server ca_file signed: %v", err)
	}
	conn.Close()

	wrong, err := tlsconfig.Config{Enabled: true, CAFile: otherCA(t), ServerName: "example.com"}.Build("x.tls")
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), wrong); err == nil {
		conn.Close()
		t.Fatal("handshake with a server ca_file did not sign succeeded")
	}
}

func TestDisabledIsPlaintext(t *testing.T) {
	tc, err := tlsconfig.Config{}.Build("x.tls")
	if tc != nil || err != nil {
		t.Fatalf("zero Config = %v, %v; want nil, nil (plaintext)", tc, err)
	}
}

func TestClientCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	// The server's certificate with a key that is not its own.
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	der, _ := x509.MarshalECPrivateKey(key)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
	_, err = tlsconfig.Config{Enabled: true, CertFile: certFile, KeyFile: keyFile}.Build("kafka.tls")
	if err == nil || !strings.Contains(err.Error(), "kafka.tls.cert_file") {
		t.Fatalf("mismatched key: err = %v, want it to name kafka.tls.cert_file", err)
	}
}

func TestValidateNamesSetting(t *testing.T) {
	for name, tc := range map[string]struct {
		c    tlsconfig.Config
		want string
	}{
		"files without enabled":    {tlsconfig.Config{CAFile: "/x"}, "redis.tls.enabled"},
		"insecure without enabled": {tlsconfig.Config{InsecureSkipVerify: true}, "redis.tls.enabled"},
		"missing ca":               {tlsconfig.Config{Enabled: true, CAFile: "/nonexistent"}, "redis.tls.ca_file"},
		"ca not pem":               {tlsconfig.Config{Enabled: true, CAFile: "/etc/hostname"}, "redis.tls.ca_file"},
		"key without cert":         {tlsconfig.Config{Enabled: true, KeyFile: "/etc/hostname"}, "redis.tls.cert_file"},
	} {
		if err := tc.c.Validate("redis.tls"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want it to name %s", name, err, tc.want)
		}
	}
}

func TestSecret(t *testing.T) {
	f := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(f, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := tlsconfig.Secret("x.password", "", f); err != nil || got != "s3cret" {
		t.Errorf("Secret from file = %q, %v; want s3cret without the newline", got, err)
	}
	if got, _ := tlsconfig.Secret("x.password", "inline", ""); got != "inline" {
		t.Errorf("Secret inline = %q", got)
	}
	if _, err := tlsconfig.Secret("x.password", "inline", f); err == nil || strings.Contains(err.Error(), "inline") || !strings.Contains(err.Error(), "x.password_file") {
		t.Errorf("both set: err = %v, want it to name x.password_file and not show the value", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	if _, err := tlsconfig.Secret("x.password", "", empty); err == nil {
		t.Error("an empty password file was accepted")
	}
}
