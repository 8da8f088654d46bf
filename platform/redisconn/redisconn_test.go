package redisconn_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// TestTLSWithACLUser: a client built from redis.tls and an ACL user with a
// password_file writes and reads over the services script's TLS port, as
// that user.
func TestTLSWithACLUser(t *testing.T) {
	rc := itest.RedisTLS(t)
	if err := rc.Validate(); err != nil {
		t.Fatalf("Validate() = %v for the services script's TLS settings", err)
	}
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := redisconn.Ready(cl)(ctx); err != nil {
		t.Fatal(err)
	}
	key := itest.Unique(t, "sluice_test:")
	if err := cl.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	if got, err := cl.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Fatalf("GET over TLS = %q, %v; want v", got, err)
	}
	if who, err := cl.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != rc.Username {
		t.Fatalf("ACL WHOAMI = %q, %v; want %s", who, err, rc.Username)
	}
}

// TestTLSPortWithoutTLSFails: a plaintext client on the TLS port fails, and
// the readiness error says TLS is the likely cause rather than only "EOF".
func TestTLSPortWithoutTLSFails(t *testing.T) {
	rc := itest.RedisTLS(t)
	rc.TLS.Enabled = false
	rc.TLS.CAFile = ""
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := redisconn.Ready(cl)(ctx)
	if err == nil || !strings.Contains(err.Error(), "redis.tls.enabled") {
		t.Fatalf("Ready() without TLS on the TLS port = %v, want an error naming redis.tls.enabled", err)
	}
}

// TestTLSWrongPasswordFails: the ACL user with a wrong password is refused,
// and the password is not in the error.
func TestTLSWrongPasswordFails(t *testing.T) {
	rc := itest.RedisTLS(t)
	rc.PasswordFile = filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(rc.PasswordFile, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := redisconn.NewClient(rc)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := redisconn.Ready(cl)(ctx)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("Ready() with a wrong password = %v, want WRONGPASS", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// TestValidateNamesSetting: credential and TLS mistakes stop start-up
// naming the setting, and a client built anyway fails every command with
// that error instead of falling back to plaintext.
func TestValidateNamesSetting(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*redisconn.Config)
		want string
	}{
		"user without password":  {func(c *redisconn.Config) { c.Username = "sluice" }, "redis.password"},
		"missing password file":  {func(c *redisconn.Config) { c.PasswordFile = "/nonexistent/pw" }, "redis.password_file"},
		"both password and file": {func(c *redisconn.Config) { c.Password, c.PasswordFile = "s3cret", "/etc/hostname" }, "redis.password and redis.password_file"},
		"tls without enabled":    {func(c *redisconn.Config) { c.TLS.ServerName = "redis" }, "redis.tls.enabled"},
		"missing ca file": {func(c *redisconn.Config) {
			c.TLS.Enabled = true
			c.TLS.CAFile = "/nonexistent/ca.pem"
		}, "redis.tls.ca_file"},
		"cert without key": {func(c *redisconn.Config) {
			c.TLS.Enabled = true
			c.TLS.CertFile = "/etc/hostname"
		}, "redis.tls.key_file"},
	} {
		t.Run(name, func(t *testing.T) {
			c := redisconn.Defaults()
			tc.mut(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to name %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
			cl := redisconn.NewClient(c)
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := cl.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ping with an invalid configuration = %v, want the error naming %s", err, tc.want)
			}
		})
	}
}

// TestPasswordNeverPrinted: the password set through the environment
// reaches the client but not fmt or slog output of the configuration.
func TestPasswordNeverPrinted(t *testing.T) {
	var cfg struct {
		Redis redisconn.Config `yaml:"redis"`
	}
	cfg.Redis = redisconn.Defaults()
	env := map[string]string{"SLUICE_REDIS_USERNAME": "sluice", "SLUICE_REDIS_PASSWORD": "s3cret"}
	err := config.Load(&cfg, config.Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Password.Reveal() != "s3cret" {
		t.Fatalf("password from SLUICE_REDIS_PASSWORD = %q", cfg.Redis.Password.Reveal())
	}
	cl := redisconn.NewClient(cfg.Redis)
	defer cl.Close()
	if cl.Options().Password != "s3cret" {
		t.Fatal("the client did not get the password")
	}
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Info("config", "redis", cfg.Redis)
	for _, out := range []string{fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), b.String()} {
		if strings.Contains(out, "s3cret") {
			t.Errorf("the password is printed: %s", out)
		}
	}
}
