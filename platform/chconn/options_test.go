package chconn

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/platform/tlsconfig"
)

// TestOptionsTLSAndPasswordFile checks what reaches clickhouse-go: the TLS
// config built from clickhouse.tls and the password read from
// password_file. A TLS handshake against the local ClickHouse 18.16 is not
// tested: the services script runs it without tcp_port_secure.
func TestOptionsTLSAndPasswordFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Defaults()
	c.Addr = "clickhouse.internal:9440"
	c.Username = "sluice"
	c.PasswordFile = pw
	c.TLS = tlsconfig.Config{Enabled: true, CAFile: ca, ServerName: "clickhouse.internal"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	o, err := c.options(c.Database)
	if err != nil {
		t.Fatal(err)
	}
	if o.TLS == nil || o.TLS.RootCAs == nil || o.TLS.ServerName != "clickhouse.internal" {
		t.Fatalf("options TLS = %+v, want the CA pool and server name from clickhouse.tls", o.TLS)
	}
	if o.Auth.Username != "sluice" || o.Auth.Password != "s3cret" {
		t.Fatalf("options Auth = %q/%q, want sluice and the password from the file", o.Auth.Username, o.Auth.Password)
	}

	plain := Defaults()
	if o, err := plain.options("default"); err != nil || o.TLS != nil {
		t.Fatalf("default options: TLS = %v, err = %v; want plaintext", o.TLS, err)
	}
}

func TestValidateCredentialsAndTLS(t *testing.T) {
	c := Defaults()
	c.Password, c.PasswordFile = "s3cret", "/etc/hostname"
	c.TLS.CAFile = "/etc/hostname"
	err := c.Validate()
	for _, want := range []string{"clickhouse.password_file", "clickhouse.tls.enabled"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the password: %v", err)
	}
}
