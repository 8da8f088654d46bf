package hotroute

import (
	"bufio"
	"bytes"
	"maps"
	"net/http"
	"slices"
	"testing"
)

// FuzzParseAgreesWithNetHTTP: whatever the Server parses itself, net/http
// parses too, to the same method, path, host, length and headers. The
// Server may hand off more than it needs to, never accept what net/http
// would read differently.
func FuzzParseAgreesWithNetHTTP(f *testing.F) {
	for _, seed := range []string{
		"POST /v1/events HTTP/1.1\r\nHost: sluice\r\nContent-Length: 2\r\n\r\n[]",
		"POST /v1/events HTTP/1.1\r\nhost: sluice:8080\r\ncontent-type: application/json\r\nx-many: a\r\nX-Many:\tb \r\ncontent-length: 0\r\n\r\n",
		"POST /v1/events HTTP/1.1\r\nHost: [::1]:80\r\nContent-Length: 007\r\n\r\n",
		"POST /v1/events HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\nContent-Length: 1\r\n\r\n",
		"POST /v1/events HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /v1/events HTTP/1.1\r\nHost: a b\r\nContent-Length: 0\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	s, err := New(Route{Method: http.MethodPost, Path: "/v1/events", MaxBodyBytes: 64, Handler: http.NotFoundHandler()}, &http.Server{ReadHeaderTimeout: 1, ReadTimeout: 1, WriteTimeout: 1, IdleTimeout: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := s.newConn(nil, bytes.NewReader(data), "fuzz")
		head, err := c.readHead(func() {})
		if err != nil || head == nil || !c.parse(head) {
			return
		}
		want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			t.Fatalf("served %q, which net/http rejects: %v", data, err)
		}
		got := c.req
		if got.Method != want.Method || got.URL.Path != want.URL.Path || want.URL.RawQuery != "" || got.Host != want.Host || got.ContentLength != want.ContentLength {
			t.Fatalf("%q: parsed %s %s host %q length %d; net/http: %s %s?%s host %q length %d",
				data, got.Method, got.URL.Path, got.Host, got.ContentLength, want.Method, want.URL.Path, want.URL.RawQuery, want.Host, want.ContentLength)
		}
		if !maps.EqualFunc(got.Header, want.Header, slices.Equal) {
			t.Fatalf("%q: headers %q; net/http: %q", data, got.Header, want.Header)
		}
	})
}
