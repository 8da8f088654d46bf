package adminapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// maxResponseBytes bounds what the Client reads of an answer; a listing of
// every breaker of a large fleet fits many times over.
const maxResponseBytes = 32 << 20

// Client calls the admin API of one enforcer. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// NewClient returns a Client for the API at baseURL (for example
// http://127.0.0.1:9471) that authenticates with token. hc nil means
// http.DefaultClient; bound calls with their context.
func NewClient(baseURL, token string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("adminapi: base URL %q is not an http(s) URL such as http://127.0.0.1:9471", baseURL)
	}
	if token == "" {
		return nil, errors.New("adminapi: a bearer token is required")
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: u, token: token, hc: hc}, nil
}

// maxCAFileBytes bounds what TrustingClient reads: a CA bundle is a few
// kilobytes, a wrong path (a log file) could be gigabytes.
const maxCAFileBytes = 1 << 20

// TrustingClient returns an HTTP client for an admin API served over TLS
// with a certificate from a private CA (or self-signed): it trusts the PEM
// certificates in caFile besides the system roots. caFile "" returns nil,
// which NewClient takes as http.DefaultClient.
func TrustingClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return nil, nil
	}
	st, err := os.Stat(caFile)
	if err != nil {
		return nil, fmt.Errorf("adminapi: CA file: %w", err)
	}
	if st.Size() > maxCAFileBytes {
		return nil, fmt.Errorf("adminapi: CA file %s is %d bytes; the limit is %d (is it a PEM bundle?)", caFile, st.Size(), maxCAFileBytes)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("adminapi: CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("adminapi: CA file %s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

// Error is a request the server refused (any status but 200).
type Error struct {
	// StatusCode and Status are the HTTP status.
	StatusCode int
	Status     string
	// Message is the server's explanation, naming the bad field and its
	// limit; empty when the answer carried none.
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "admin API: " + e.Status
	}
	return "admin API: " + e.Status + ": " + e.Message
}

// WhoAmI returns who the token is: its name, role and tenant.
func (c *Client) WhoAmI(ctx context.Context) (WhoAmIResponse, error) {
	var r WhoAmIResponse
	err := c.get(ctx, PathWhoAmI, "", &r)
	return r, err
}

// Breakers lists open and half-open breakers; tenant "" lists every tenant's.
func (c *Client) Breakers(ctx context.Context, tenant string) ([]Breaker, error) {
	var r BreakersResponse
	err := c.get(ctx, PathBreakers, tenant, &r)
	return r.Breakers, err
}

// Flags lists the flags gateways see; tenant "" lists every tenant's.
func (c *Client) Flags(ctx context.Context, tenant string) ([]Flag, error) {
	var r FlagsResponse
	err := c.get(ctx, PathFlags, tenant, &r)
	return r.Flags, err
}

// Overrides lists temporary quota overrides; tenant "" lists every tenant's.
func (c *Client) Overrides(ctx context.Context, tenant string) ([]Override, error) {
	var r OverridesResponse
	err := c.get(ctx, PathOverrides, tenant, &r)
	return r.Overrides, err
}

// Do performs action with req. A refused action returns an *Error.
func (c *Client) Do(ctx context.Context, action Action, req Request) (ActionResponse, error) {
	var r ActionResponse
	path := action.Path()
	if path == "" {
		return r, fmt.Errorf("adminapi: unknown action %q", action)
	}
	err := c.post(ctx, path, req, &r)
	return r, err
}

// Trip opens a manual breaker (ActionTrip).
func (c *Client) Trip(ctx context.Context, req Request) (ActionResponse, error) {
	return c.Do(ctx, ActionTrip, req)
}

// Reset closes breakers (ActionReset).
func (c *Client) Reset(ctx context.Context, req Request) (ActionResponse, error) {
	return c.Do(ctx, ActionReset, req)
}

// Blacklist blocks a tenant or API key (ActionBlacklist).
func (c *Client) Blacklist(ctx context.Context, req Request) (ActionResponse, error) {
	return c.Do(ctx, ActionBlacklist, req)
}

// Unblacklist lifts a blacklist (ActionUnblacklist).
func (c *Client) Unblacklist(ctx context.Context, req Request) (ActionResponse, error) {
	return c.Do(ctx, ActionUnblacklist, req)
}

// SetOverride sets a temporary quota limit (ActionSetOverride).
func (c *Client) SetOverride(ctx context.Context, req Request) (ActionResponse, error) {
	return c.Do(ctx, ActionSetOverride, req)
}

// ClearOverride removes a temporary quota limit (ActionClearOverride).
func (c *Client) ClearOverride(ctx context.Context, req Request) (ActionResponse, error) {
	return c.Do(ctx, ActionClearOverride, req)
}

func (c *Client) url(path, tenant string) string {
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	if tenant != "" {
		u.RawQuery = url.Values{"tenant": {tenant}}.Encode()
	}
	return u.String()
}

func (c *Client) get(ctx context.Context, path, tenant string, out any) error {
	return c.call(ctx, http.MethodGet, c.url(path, tenant), nil, out)
}

func (c *Client) call(ctx context.Context, method, u string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("adminapi: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("adminapi: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return fmt.Errorf("adminapi: reading the answer to %s %s: %w", method, req.URL.Path, err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{StatusCode: resp.StatusCode, Status: resp.Status}
		var er ErrorResponse
		if json.Unmarshal(raw, &er) == nil {
			e.Message = er.Error.Message
		}
		return e
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("adminapi: the answer to %s %s is not the expected JSON: %w", method, req.URL.Path, err)
	}
	return nil
}
