// Package tlsconfig is the one TLS client setting every Sluice connection
// shares (Kafka, Redis, ClickHouse), and the one way a password is given
// without writing it into a YAML file. Keeping both here means the three
// clients validate files, name settings in errors and warn about disabled
// verification identically.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// Config is the client side of TLS towards one backing service. The zero
// value is plaintext, which is what the local services script runs.
type Config struct {
	Enabled            bool   `yaml:"enabled" help:"connect with TLS"`
	CAFile             string `yaml:"ca_file" help:"PEM file of the CA(s) that sign the server certificate (empty: the system roots)"`
	CertFile           string `yaml:"cert_file" help:"PEM client certificate for mutual TLS (with key_file)"`
	KeyFile            string `yaml:"key_file" help:"PEM private key of cert_file"`
	ServerName         string `yaml:"server_name" help:"name to verify in the server certificate (empty: the host of the address)"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify" help:"DANGEROUS: accept any server certificate (testing only; logged as a warning)"`
}

// Validate checks c under the settings prefix (e.g. "kafka.tls") by building
// it, so an unreadable file or a key that does not match its certificate
// stops the service at start-up naming the setting, not at first connect.
func (c Config) Validate(prefix string) error {
	_, err := c.build(prefix)
	return err
}

// Build returns the *tls.Config for c, or nil when TLS is not enabled.
// insecure_skip_verify is logged as a warning every time a client is built
// from it: it must never pass unnoticed into production.
func (c Config) Build(prefix string) (*tls.Config, error) {
	tc, err := c.build(prefix)
	if err == nil && tc != nil && tc.InsecureSkipVerify {
		slog.Warn("TLS server certificate verification is DISABLED: any server can impersonate this one; "+
			"set "+prefix+".ca_file instead of "+prefix+".insecure_skip_verify outside tests",
			"setting", prefix+".insecure_skip_verify")
	}
	return tc, err
}

func (c Config) build(prefix string) (*tls.Config, error) {
	if !c.Enabled {
		// A file given without enabled=true is almost certainly a
		// forgotten switch: refuse rather than silently talk plaintext.
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" || c.InsecureSkipVerify {
			return nil, fmt.Errorf("%s: TLS settings are given but %s.enabled is false; set %s.enabled=true or remove them", prefix, prefix, prefix)
		}
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify}
	var errs []error
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s.ca_file: %w", prefix, err))
		default:
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("%s.ca_file: %s holds no PEM certificate", prefix, c.CAFile))
			}
			tc.RootCAs = pool
		}
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.cert_file/%s.key_file: %w", prefix, prefix, err))
		} else {
			tc.Certificates = []tls.Certificate{cert}
		}
	case c.CertFile != "":
		errs = append(errs, fmt.Errorf("%s.key_file: required with %s.cert_file", prefix, prefix))
	case c.KeyFile != "":
		errs = append(errs, fmt.Errorf("%s.cert_file: required with %s.key_file", prefix, prefix))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return tc, nil
}

// Password is a secret setting. It prints as "[redacted]" through fmt
// (%v, %+v, %s, %q, %#v), JSON and slog, so logging a whole configuration struct
// cannot leak it; Reveal is the one way to read it.
type Password string

const redacted = "[redacted]"

// Reveal returns the secret itself, for handing to a client library.
func (p Password) Reveal() string { return string(p) }

// String redacts; an empty password stays empty so "not set" is visible.
func (p Password) String() string {
	if p == "" {
		return ""
	}
	return redacted
}

// GoString redacts for %#v.
func (p Password) GoString() string { return `"` + p.String() + `"` }

// MarshalJSON redacts when a struct holding p is encoded, as slog's JSON
// handler does with struct attributes.
func (p Password) MarshalJSON() ([]byte, error) { return []byte(`"` + p.String() + `"`), nil }

// LogValue redacts for slog.
func (p Password) LogValue() slog.Value { return slog.StringValue(p.String()) }

// Secret resolves a password given either inline (value, typically from an
// environment variable) or as a file (Kubernetes and Docker secrets mount
// them so). A trailing newline in the file is dropped: editors add one.
// field names the inline setting in errors (e.g. "redis.password"); the
// file setting is field+"_file". The secret itself never appears in an error.
func Secret(field string, value Password, file string) (string, error) {
	if file == "" {
		return value.Reveal(), nil
	}
	if value != "" {
		return "", fmt.Errorf("%s and %s_file are both set; keep one", field, field)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s_file: %w", field, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s_file: %s is empty", field, file)
	}
	return s, nil
}
