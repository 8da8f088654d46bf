package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strconv"
	"time"
)

// ParseURL parses the URL of an HTTP receiver (a webhook, Alertmanager)
// and accepts only an absolute http or https URL with a host: anything else
// would fail on every send, so it is refused when the channel is defined.
// It is the one URL check of the alerter. Its errors never quote the
// value: a webhook URL carries credentials (DingTalk's access_token,
// Slack's secret path) and a refused policy reload is logged.
func ParseURL(raw string) (*neturl.URL, error) {
	const hint = "use an absolute URL such as https://host/path (the value is not shown: webhook URLs carry credentials)"
	u, err := neturl.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("does not parse as a URL; %s", hint)
	case u.Scheme == "" || u.Host == "":
		return nil, fmt.Errorf("has no scheme and host; %s", hint)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("scheme %q is not http or https; %s", u.Scheme, hint)
	}
	return u, nil
}

// PostJSON marshals payload and POSTs it to url with contentType, the one
// delivery step every receiver shares. It returns the start of the answer's
// body on a 2xx; a payload or URL that cannot make a request is Permanent, a
// transport failure is retried, and a non-2xx answer is classified by
// HTTPStatusError.
//
// No error it returns contains url: webhook URLs carry their credentials
// (DingTalk's access_token and sign, Slack's secret path), and these errors
// end up in logs. The dispatcher's log names the channel instead.
func PostJSON(ctx context.Context, c *http.Client, receiver, url, contentType string, payload any) ([]byte, error) {
	body, err := json.Marshal(payload)
	if err != nil {
		return nil, Permanent(err)
	}
	return Post(ctx, c, receiver, url, http.Header{"Content-Type": {contentType}}, body)
}

// Post POSTs body to url with header, for a receiver that signs the exact
// bytes it sends (the webhook kind); otherwise it is PostJSON, with the
// same answers and the same care never to quote url.
func Post(ctx context.Context, c *http.Client, receiver, url string, header http.Header, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, Permanent(fmt.Errorf("%s: the URL cannot make a request (URL withheld: it may carry credentials)", receiver))
	}
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		// *url.Error quotes the whole URL; keep only what went wrong.
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%s: POST failed: %w", receiver, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 300 {
		return raw, HTTPStatusError(receiver, resp, raw)
	}
	return raw, nil
}

// HTTPStatusError turns a webhook's non-2xx answer into an error the
// dispatcher acts on: 429 waits for Retry-After, other 4xx are permanent
// (the request itself is wrong and would fail again), 5xx are retried.
func HTTPStatusError(receiver string, resp *http.Response, body []byte) error {
	err := fmt.Errorf("%s: %s: %.200s", receiver, resp.Status, body)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		wait := time.Second
		if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		return RetryAfter(err, wait)
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout:
		return Permanent(err)
	}
	return err
}
