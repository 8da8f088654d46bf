package enforcer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/itest"
)

// selfSigned writes a fresh self-signed certificate for 127.0.0.1 and its
// key as PEM files and returns their paths.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice-enforcer-admin-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// startAdmin runs the admin API as Run builds it (listenAdmin) on a free
// loopback port until the test ends and returns its address.
func startAdmin(t *testing.T, cfg Config) string {
	t.Helper()
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Admin.Tokens = []adminapi.Token{{Name: "alice", SHA256: adminapi.HashToken("s3cret")}}
	c := newCore(cfg, nil, testWatcher(t), quietLog())
	srv, err := listenAdmin(cfg, c, nil, nil, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.serve() }()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("admin server: %v", err)
		}
	})
	go func() { _ = srv.shutdownOnDone(ctx, time.Second) }()
	return srv.ln.Addr().String()
}

// TestAdminAPIServesTLS: with a certificate and key configured, the admin
// API speaks only HTTPS; the typed client trusting the (self-signed)
// certificate through a CA file lists breakers, a client that does not
// trust it and a plain-HTTP client are refused.
func TestAdminAPIServesTLS(t *testing.T) {
	cfg := testConfig(t)
	cfg.Admin.TLSCertFile, cfg.Admin.TLSKeyFile = selfSigned(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	addr := startAdmin(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	hc, err := adminapi.TrustingClient(cfg.Admin.TLSCertFile)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := adminapi.NewClient("https://"+addr, "s3cret", hc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Breakers(ctx, "acme"); err != nil {
		t.Fatalf("HTTPS with the trusted certificate: %v", err)
	}

	untrusting, _ := adminapi.NewClient("https://"+addr, "s3cret", nil)
	if _, err := untrusting.Breakers(ctx, "acme"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client that does not trust the certificate: %v, want a certificate error", err)
	}
	plain, _ := adminapi.NewClient("http://"+addr, "s3cret", nil)
	if _, err := plain.Breakers(ctx, "acme"); err == nil {
		t.Fatal("plain HTTP to the TLS admin API succeeded")
	}
}

func TestAdminTLSSettingsNameTheProblem(t *testing.T) {
	cfg := testConfig(t)
	cfg.Admin.TLSCertFile = "/nonexistent.crt"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "enforcer.admin.tls_key_file") {
		t.Fatalf("cert without key: %v", err)
	}
	cfg.Admin.TLSKeyFile = "/nonexistent.key"
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Admin.Tokens = []adminapi.Token{{Name: "alice", SHA256: adminapi.HashToken("s3cret")}}
	_, err := listenAdmin(cfg, newCore(cfg, nil, testWatcher(t), quietLog()), nil, nil, quietLog())
	if err == nil || !strings.Contains(err.Error(), "enforcer.admin.tls_cert_file (/nonexistent.crt)") {
		t.Fatalf("missing certificate file: %v", err)
	}
}

// TestAdminAPICutsOffSlowClients: a client that sends an action's headers
// and never its body, or idles on keep-alive, loses the connection once
// enforcer.admin.http's timeouts pass (the API used to have only a header
// timeout, so such a client held a connection forever).
func TestAdminAPICutsOffSlowClients(t *testing.T) {
	cfg := testConfig(t)
	cfg.Admin.HTTP = httpserver.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Write: 300 * time.Millisecond, Idle: 300 * time.Millisecond}
	addr := startAdmin(t, cfg)
	for name, req := range map[string]string{
		"unfinished body": "POST " + adminapi.ActionTrip.Path() + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Length: 1000\r\n\r\n{\"tenant\":",
		"idle keep-alive": "GET " + adminapi.PathBreakers + "?tenant=acme HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) { itest.ExpectCutOff(t, addr, req) })
	}
}
