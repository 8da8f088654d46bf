package hotroute_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/httpserver/hotroute"
	"github.com/sluicehq/sluice/platform/itest"
)

// echo answers with what it was given, so that two servers' answers to
// the same request are equal only if both parsed it alike.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
		return
	}
	names := make([]string, 0, len(r.Header))
	for name := range r.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	w.Header().Set("X-Echo-Method", r.Method)
	w.Header().Set("X-Echo-Line", "a\r\nInjected: yes") // a handler's CR LF must not end the header
	w.Header()["X-Echo-Many"] = []string{"1", "2"}
	fmt.Fprintf(w, "%s %s %s host=%q length=%d\n", r.Method, r.URL.Path, r.URL.RawQuery, r.Host, r.ContentLength)
	for _, name := range names {
		fmt.Fprintf(w, "%s: %q\n", name, r.Header[name])
	}
	fmt.Fprintf(w, "body %q\n", body)
})

// short are timeouts a test can wait out.
var short = httpserver.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Write: 300 * time.Millisecond, Idle: 300 * time.Millisecond}

const maxBody = 64

// serveHot runs a hotroute Server for POST /v1/events (bodies up to
// maxBody bytes) with h on both routes until the test ends.
func serveHot(t *testing.T, h http.Handler, timeouts httpserver.Timeouts) (string, *hotroute.Server) {
	t.Helper()
	srv, err := hotroute.New(hotroute.Route{Method: http.MethodPost, Path: "/v1/events", MaxBodyBytes: maxBody, Handler: h}, httpserver.New(h, timeouts, nil))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return ln.Addr().String(), srv
}

// serveNetHTTP runs h on a plain net/http server until the test ends.
func serveNetHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserver.New(h, httpserver.Defaults(), nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn
}

// exchange writes raw to a new connection and returns the first answer,
// printed with its headers in order and without Date, which differs by
// the second.
func exchange(t *testing.T, addr, raw string) string {
	t.Helper()
	conn := dial(t, addr)
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "no answer: " + err.Error()
	}
	return printAnswer(t, resp)
}

func printAnswer(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Del("Date")
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s close=%v\n", resp.Proto, resp.Status, resp.Close)
	_ = resp.Header.Write(&b)
	b.Write(body)
	return b.String()
}

// Every request, hot or not, gets the answer net/http alone would give,
// and only the plain form of the route is served off the connection.
func TestAnswersAsNetHTTPDoes(t *testing.T) {
	hotAddr, hot := serveHot(t, echo, httpserver.Defaults())
	plainAddr := serveNetHTTP(t, echo)
	const head = "POST /v1/events HTTP/1.1\r\nHost: sluice\r\n"
	for _, c := range []struct {
		name, raw string
		hot       bool
	}{
		{"plain", head + "Content-Type: application/json\r\nContent-Length: 5\r\n\r\n[{}] ", true},
		{"lower-case names", "POST /v1/events HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\nx-api-KEY: k\r\ncontent-length: 2\r\n\r\n[]", true},
		{"repeated header and white space", head + "X-Many: a\r\nX-Many:\tb \r\nX-Empty:\r\nContent-Length: 0\r\n\r\n", true},
		{"value bytes above 0x7f", head + "X-Name: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n", true},
		{"body at the bound", head + "Content-Length: 64\r\n\r\n" + strings.Repeat("x", 64), true},
		{"body above the bound", head + "Content-Length: 65\r\n\r\n" + strings.Repeat("x", 65), false},
		{"query string", "POST /v1/events?x=1 HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\n\r\n", false},
		{"other path", "POST /v1/event HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\n\r\n", false},
		{"other method", "GET /v1/events HTTP/1.1\r\nHost: sluice\r\n\r\n", false},
		{"HTTP/1.0", "POST /v1/events HTTP/1.0\r\nHost: sluice\r\nContent-Length: 0\r\n\r\n", false},
		{"chunked", head + "Transfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n", false},
		{"chunked and a length", head + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n", false},
		{"two lengths", head + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n[]", false},
		{"signed length", head + "Content-Length: +2\r\n\r\n[]", false},
		{"no length", head + "\r\n", false},
		{"expect", head + "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n[]", false},
		{"connection close", head + "Connection: close\r\nContent-Length: 2\r\n\r\n[]", false},
		{"connection keep-alive", head + "Connection: Keep-Alive\r\nContent-Length: 2\r\n\r\n[]", true},
		{"connection upgrade", head + "Connection: keep-alive, Upgrade\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n[]", false},
		{"no host", "POST /v1/events HTTP/1.1\r\nContent-Length: 0\r\n\r\n", false},
		{"two hosts", head + "Host: other\r\nContent-Length: 0\r\n\r\n", false},
		{"malformed host", "POST /v1/events HTTP/1.1\r\nHost: a b\r\nContent-Length: 0\r\n\r\n", false},
		{"host with a port", "POST /v1/events HTTP/1.1\r\nHost: [::1]:8080\r\nContent-Length: 0\r\n\r\n", true},
		{"space in a name", head + "Bad Name: x\r\nContent-Length: 0\r\n\r\n", false},
		{"space before the colon", head + "X-Name : x\r\nContent-Length: 0\r\n\r\n", false},
		{"folded value", head + "X-Name: a\r\n b\r\nContent-Length: 0\r\n\r\n", false},
		{"control byte in a value", head + "X-Name: a\x01b\r\nContent-Length: 0\r\n\r\n", false},
		{"bare LF line ends", "POST /v1/events HTTP/1.1\nHost: sluice\nContent-Length: 0\n\n", false},
		{"head longer than the buffer", head + "X-Long: " + strings.Repeat("y", 5000) + "\r\nContent-Length: 0\r\n\r\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			served, handedOff := hot.Served(), hot.HandedOff()
			got, want := exchange(t, hotAddr, c.raw), exchange(t, plainAddr, c.raw)
			if got != want {
				t.Errorf("answer of the hot route server:\n%s\nnet/http's:\n%s", got, want)
			}
			if strings.Contains(got, "Injected") && !strings.Contains(got, "X-Echo-Line: a  Injected: yes") {
				t.Errorf("a handler's CR LF ended its header:\n%s", got)
			}
			wasHot := hot.Served() > served
			if wasHot != c.hot || !c.hot && hot.HandedOff() == handedOff {
				t.Errorf("served by the hot route: %v (handed off %d → %d), want %v", wasHot, handedOff, hot.HandedOff(), c.hot)
			}
		})
	}
}

// A connection keeps its order whoever answers: pipelined requests get
// their answers in turn, a body the handler did not read is skipped, and
// once a request is handed off net/http answers the rest.
func TestOneConnectionHotThenHandedOff(t *testing.T) {
	ignoresBody := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s %s", r.Method, r.Header.Get("X-Seq"))
	})
	addr, hot := serveHot(t, ignoresBody, httpserver.Defaults())
	conn := dial(t, addr)
	req := func(seq int, method, extra string) string {
		return fmt.Sprintf("%s /v1/events HTTP/1.1\r\nHost: s\r\nX-Seq: %d\r\n%sContent-Length: 3\r\n\r\nabc", method, seq, extra)
	}
	// One write: the server reads them as one stream.
	_, err := io.WriteString(conn, req(1, "POST", "")+req(2, "POST", "")+req(3, "PUT", "")+req(4, "POST", ""))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for i, want := range []string{"POST 1", "POST 2", "PUT 3", "POST 4"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != want || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %d: %d %q, want 200 %q", i+1, resp.StatusCode, body, want)
		}
	}
	if hot.Served() != 2 || hot.HandedOff() != 1 {
		t.Fatalf("served %d, handed off %d; want 2 served by the hot route, then the connection handed off", hot.Served(), hot.HandedOff())
	}
}

// The fallback server's timeouts hold on the hot route too.
func TestSlowClientsAreCutOff(t *testing.T) {
	addr, _ := serveHot(t, echo, short)
	for name, raw := range map[string]string{
		"headers never finished": "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Slow: ",
		"body never finished":    "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n{\"a\":",
		"idle keep-alive":        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) { itest.ExpectCutOff(t, addr, raw) })
	}
}

// Shutdown closes idle connections at once and lets a request in flight
// finish with its answer, which tells the client the connection closes.
func TestShutdownFinishesRequestsInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Wait") != "" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "done")
	})
	srv, err := hotroute.New(hotroute.Route{Method: http.MethodPost, Path: "/v1/events", MaxBodyBytes: maxBody, Handler: h}, httpserver.New(h, httpserver.Defaults(), nil))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	addr := ln.Addr().String()

	idle := dial(t, addr)
	fmt.Fprint(idle, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	idleReader := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(idleReader, nil); err != nil {
		t.Fatalf("first answer: %v", err)
	} else if got := printAnswer(t, resp); !strings.HasSuffix(got, "done") {
		t.Fatalf("first answer:\n%s", got)
	}
	busy := dial(t, addr)
	fmt.Fprint(busy, "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Wait: 1\r\nContent-Length: 0\r\n\r\n")
	<-entered

	stopped := make(chan error, 1)
	go func() { stopped <- srv.Shutdown(context.Background()) }()
	if _, err := idleReader.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection after Shutdown: read %v, want EOF", err)
	}
	close(release)
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatalf("the request in flight got no answer: %v", err)
	}
	if got := printAnswer(t, resp); !strings.Contains(got, "close=true") || !strings.HasSuffix(got, "done") {
		t.Fatalf("answer in flight at Shutdown:\n%s\nwant its body and Connection: close", got)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve returned %v, want http.ErrServerClosed", err)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("the listener still accepts after Shutdown")
	}
}

// A handler's panic closes its own connection, logged, and nothing else.
func TestPanicClosesOnlyItsConnection(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Panic") != "" {
			panic("handler bug")
		}
		_, _ = io.WriteString(w, "ok")
	})
	addr, _ := serveHot(t, h, httpserver.Defaults())
	bad := dial(t, addr)
	fmt.Fprint(bad, "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Panic: 1\r\nContent-Length: 0\r\n\r\n")
	if n, err := io.Copy(io.Discard, bad); err != nil || n != 0 {
		t.Fatalf("panicking request: read %d bytes, %v; want the connection closed without an answer", n, err)
	}
	if got := exchange(t, addr, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"); !strings.HasSuffix(got, "\nok") {
		t.Fatalf("after another connection's panic:\n%s", got)
	}
}

func TestNewRejectsIncompleteRoutes(t *testing.T) {
	fallback := httpserver.New(echo, httpserver.Defaults(), nil)
	for _, c := range []struct {
		route hotroute.Route
		want  string
	}{
		{hotroute.Route{Path: "/x", MaxBodyBytes: 1, Handler: echo}, "set a method and an absolute path"},
		{hotroute.Route{Method: "POST", Path: "x", MaxBodyBytes: 1, Handler: echo}, "set a method and an absolute path"},
		{hotroute.Route{Method: "POST", Path: "/x", MaxBodyBytes: 2 << 20, Handler: echo}, "MaxBodyBytes = 2097152 is outside 1..1048576"},
		{hotroute.Route{Method: "POST", Path: "/x", MaxBodyBytes: 1}, "no handler"},
	} {
		if _, err := hotroute.New(c.route, fallback); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", c.route, err, c.want)
		}
	}
	if _, err := hotroute.New(hotroute.Route{Method: "POST", Path: "/x", MaxBodyBytes: 1, Handler: echo}, &http.Server{}); err == nil {
		t.Error("New accepted a fallback server without timeouts")
	}
}

// Concurrent connections each get the answers to their own requests,
// through Go's own client.
func TestConcurrentConnectionsKeepTheirOwnRequests(t *testing.T) {
	addr, hot := serveHot(t, echo, httpserver.Defaults())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 20 * time.Second}
	errs := make(chan error, 16)
	for g := range 16 {
		go func() {
			for i := range 50 {
				body := fmt.Sprintf("g%d-r%d", g, i)
				resp, err := client.Post("http://"+addr+"/v1/events", "text/plain", strings.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.Contains(string(got), fmt.Sprintf("body %q", body)) {
					errs <- fmt.Errorf("request %s answered %q", body, got)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if hot.Served() != 800 {
		t.Fatalf("hot route served %d of 800 plain requests", hot.Served())
	}
}
