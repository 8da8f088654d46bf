package emitter

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
)

// HTTPSender posts batches to the ingest API (POST /v1/events) as a JSON
// array. How it reads the answers:
//
//   - 202: every event was acknowledged by the broker.
//   - 207, 400 or 403 with per-event rejections: those events are refused
//     for good (invalid, or a tenant the key may not report); the rest were
//     acknowledged.
//   - 413: the batch is too large as a whole ([TooLargeError]); the
//     Emitter splits it and sends the halves.
//   - 401, 408, 429, 5xx and network errors: retried, honouring
//     Retry-After. 401 is retried because a key rotation in progress heals
//     it; the buffer bound still applies meanwhile.
//   - any other 2xx or 3xx (200 from a proxy, an empty answer): retried,
//     because ingest acknowledges events only with 202 or 207 and anything
//     else may mean they never reached the broker; ingest deduplicates the
//     retry.
//   - other 4xx (415, a malformed batch): the batch is refused.
type HTTPSender struct {
	// URL is the ingest base URL, e.g. https://sluice.example.com.
	URL string
	// APIKey is sent as a bearer token.
	APIKey string
	// Client makes the requests; nil means a client with a 30s timeout.
	Client *http.Client
	// Gzip compresses request bodies, trading gateway CPU for bandwidth.
	Gzip bool
}

var defaultHTTPClient = &http.Client{Timeout: 30 * time.Second}

// Send implements Sender.
func (s *HTTPSender) Send(ctx context.Context, events []schemas.UsageEvent) ([]Rejection, error) {
	body := make([]byte, 0, 256*len(events))
	body = append(body, '[')
	for i := range events {
		if i > 0 {
			body = append(body, ',')
		}
		body = eventjson.AppendUsageEventJSON(body, &events[i])
	}
	body = append(body, ']')
	var rd io.Reader = bytes.NewReader(body)
	if s.Gzip {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		_, _ = zw.Write(body)
		_ = zw.Close()
		rd = &z
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(s.URL, "/")+"/v1/events", rd)
	if err != nil {
		return nil, &PermanentError{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if s.Gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	if s.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.APIKey)
	}
	cl := s.Client
	if cl == nil {
		cl = defaultHTTPClient
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, &RetryError{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, &RetryError{Err: fmt.Errorf("reading the answer: %w", err)}
	}
	var ans struct {
		Rejected []struct {
			Index  int `json:"index"`
			Errors []struct {
				Field  string `json:"field"`
				Reason string `json:"reason"`
			} `json:"errors"`
		} `json:"rejected"`
		Error string `json:"error"`
	}
	_ = json.Unmarshal(raw, &ans) // a proxy's HTML error page is judged by its status alone
	rejected := make([]Rejection, 0, len(ans.Rejected))
	for _, r := range ans.Rejected {
		if r.Index < 0 || r.Index >= len(events) {
			continue
		}
		reason := "rejected"
		if len(r.Errors) > 0 {
			reason = strings.TrimPrefix(r.Errors[0].Field+": ", ": ") + r.Errors[0].Reason
		}
		rejected = append(rejected, Rejection{Index: r.Index, Reason: reason})
	}
	code := resp.StatusCode
	switch {
	case code == http.StatusAccepted || code == http.StatusMultiStatus:
		return rejected, nil
	case (code == http.StatusBadRequest || code == http.StatusForbidden) && len(rejected) > 0:
		return rejected, nil
	case code == http.StatusRequestEntityTooLarge:
		return nil, &TooLargeError{Err: fmt.Errorf("ingest answered 413 for %d events (%d bytes): %s", len(events), len(body), ans.Error)}
	case code < 400:
		return nil, &RetryError{Err: fmt.Errorf("ingest answered %d, which does not acknowledge events (only 202 and 207 do)", code),
			After: retryAfter(resp.Header.Get("Retry-After"))}
	case code == http.StatusUnauthorized || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		return nil, &RetryError{Err: fmt.Errorf("ingest answered %d: %s", code, ans.Error), After: retryAfter(resp.Header.Get("Retry-After"))}
	}
	return nil, &PermanentError{Err: errors.New("ingest answered " + strconv.Itoa(code) + ": " + ans.Error)}
}

func retryAfter(h string) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n > 0 && n < 3600 {
		return time.Duration(n) * time.Second
	}
	return 0
}
