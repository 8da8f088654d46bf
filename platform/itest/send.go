package itest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Send sends a request to url with body (none when empty) and header,
// given as name, value pairs, and returns the answer and its body, read
// as far as it goes (a test may cut it) and closed. A request that cannot
// be sent fails t.
func Send(t testing.TB, method, url, body string, header ...string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
