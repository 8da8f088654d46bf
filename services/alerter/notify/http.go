package notify

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

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
