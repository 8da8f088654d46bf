// Package httpserver builds every HTTP server Sluice runs (the events API,
// the enforcer's admin API, the operational endpoints, the demo's servers),
// so that none is created without read, write and idle timeouts.
//
// A server with only a header timeout lets a client that sends its headers
// and then trickles (or never sends) its body hold a connection and a
// goroutine forever; a client that never reads the answer does the same on
// the write side; an idle keep-alive connection is never closed. A few
// thousand of those exhaust file descriptors without any authentication.
// A test in this package fails if an http.Server is built anywhere else.
package httpserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Timeouts bound one server's connections. A zero field takes the value of
// [Defaults]; none can be switched off.
type Timeouts struct {
	ReadHeader time.Duration `yaml:"read_header_timeout" help:"time a client has to send the request headers"`
	Read       time.Duration `yaml:"read_timeout" help:"time a client has to send a whole request, headers and body; a slower client is cut off"`
	Write      time.Duration `yaml:"write_timeout" help:"time from the end of the request headers to the end of the answer; a client that does not read it is cut off"`
	Idle       time.Duration `yaml:"idle_timeout" help:"how long a keep-alive connection may wait for its next request"`
}

// Defaults suit small JSON requests and answers on a local network: 5s for
// headers, 30s for the whole request, 60s to answer, 2 minutes idle.
func Defaults() Timeouts {
	return Timeouts{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Write: 60 * time.Second, Idle: 2 * time.Minute}
}

// withDefaults fills every zero field from Defaults.
func (t Timeouts) withDefaults() Timeouts {
	d := Defaults()
	t.ReadHeader = cmp.Or(t.ReadHeader, d.ReadHeader)
	t.Read = cmp.Or(t.Read, d.Read)
	t.Write = cmp.Or(t.Write, d.Write)
	t.Idle = cmp.Or(t.Idle, d.Idle)
	return t
}

// Validate names, under prefix (the settings' path, "ops" for example),
// each timeout outside 10ms..1h and a header timeout longer than the
// request timeout.
func (t Timeouts) Validate(prefix string) error {
	var errs []error
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"read_header_timeout", t.ReadHeader}, {"read_timeout", t.Read}, {"write_timeout", t.Write}, {"idle_timeout", t.Idle}} {
		if f.v < 10*time.Millisecond || f.v > time.Hour {
			errs = append(errs, fmt.Errorf("%s.%s: %v is outside 10ms..1h", prefix, f.name, f.v))
		}
	}
	if t.ReadHeader > t.Read {
		errs = append(errs, fmt.Errorf("%s.read_header_timeout: %v is longer than %s.read_timeout (%v), which already bounds the headers", prefix, t.ReadHeader, prefix, t.Read))
	}
	return errors.Join(errs...)
}

// MaxHeaderBytes bounds a request's headers (Go's default is 1 MiB). Sluice's
// clients send a bearer token and a few content headers.
const MaxHeaderBytes = 64 << 10

// New returns a server for h with every timeout of t set (zero fields take
// Defaults) and its internal errors (TLS handshakes, malformed requests)
// logged through log at debug level, where a scanner cannot fill the logs.
func New(h http.Handler, t Timeouts, log *slog.Logger) *http.Server {
	t = t.withDefaults()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
	if log != nil {
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	}
	return srv
}

// LoadTLS returns the server TLS configuration for a PEM certificate
// (chain) and key file, TLS 1.2 at least, or an error naming the settings
// (certSetting, keySetting) and saying what is wrong. The files are read
// once: a renewed certificate takes a restart.
func LoadTLS(certFile, keyFile, certSetting, keySetting string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%s and %s: set both (a PEM certificate and its key) or neither", certSetting, keySetting)
	}
	if certFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s (%s), %s (%s): %w; they must be a PEM certificate and its matching PEM key", certSetting, certFile, keySetting, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// ServeUntilDone serves srv on ln until ctx ends, then shuts it down,
// letting requests in flight finish within grace. Only a failure of the
// listener itself is an error.
func ServeUntilDone(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	served := make(chan error, 1)
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			served <- err
			return
		}
		served <- nil
	}()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return <-served
}

// IsLoopback reports whether a listen host stays on this machine, for the
// services that warn when they would send secrets over plain HTTP beyond it.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
