// Package hotroute serves one hot HTTP/1.1 route straight off the
// connection and hands every other request to a net/http server.
//
// At one small request per call, net/http's connection loop costs more
// CPU than the handler it calls: per request it parses into fresh maps
// and strings, clones the answer's headers, builds a context, and starts
// a goroutine that reads in the background to notice a client going away
// (bench/README.md, "One-event requests"). A [Server] parses only the
// plainest form of its one [Route] — the route's method and exact path,
// HTTP/1.1, a Content-Length body within the route's bound, no
// Transfer-Encoding, Expect or Upgrade header, no Connection header but
// keep-alive, CRLF line ends — and calls the route's http.Handler with a request, headers and
// an answer it reuses for the life of the connection.
//
// Anything else, from the first byte of a request that is not of that
// plain form, goes to the net/http server together with the rest of its
// connection: other paths and methods, chunked bodies, oversized heads or
// bodies, malformed requests. They keep net/http's behaviour, its error
// answers and its limits; nothing is parsed twice in a way that could
// disagree, because a connection is never handed back.
//
// What a handler does not get on the hot route:
//   - its request's context is not cancelled when the client goes away
//     (the answer's write fails instead), nor when the handler returns;
//   - the answer is buffered and written at once, with its Content-Length,
//     when the handler returns: the ResponseWriter implements neither
//     http.Flusher nor http.Hijacker, and 1xx codes are dropped;
//   - the *http.Request and its Header are reused for the connection's
//     next request: a handler must not keep them after it returns, as
//     net/http's documentation already asks.
package hotroute

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Route is the one request shape a Server serves itself.
type Route struct {
	// Method is the request method, "POST" for example.
	Method string
	// Path is the exact request target; a request with a query string or
	// any other target goes to the fallback server.
	Path string
	// MaxBodyBytes bounds the Content-Length the Server reads itself;
	// larger bodies go to the fallback server, whose handler applies its
	// own limits. Between 1 and 1 MiB.
	MaxBodyBytes int64
	// Handler serves the route: usually the fallback server's own handler
	// for the same route, so both paths answer alike.
	Handler http.Handler
}

// readBufferSize bounds the head the Server parses itself (request line
// and headers); a longer head goes to the fallback server, which applies
// its own MaxHeaderBytes.
const readBufferSize = 4096

// Server serves a Route on raw connections and every other request on a
// fallback *http.Server, whose timeouts it applies to its own connections
// too. Build one with New; it is used once, like an http.Server.
type Server struct {
	route    Route
	line     []byte // "POST /path HTTP/1.1\r\n"
	fallback *http.Server
	handoff  *handoffListener

	mu      sync.Mutex
	ln      net.Listener
	conns   map[*conn]struct{}
	closing atomic.Bool

	served    atomic.Uint64
	handedOff atomic.Uint64
}

// New returns a Server for route that hands everything else to fallback
// (built by httpserver.New, so that its timeouts are set: the Server
// applies fallback's ReadHeaderTimeout, ReadTimeout, WriteTimeout and
// IdleTimeout to its own connections, which must all be positive).
func New(route Route, fallback *http.Server) (*Server, error) {
	switch {
	case route.Method == "" || route.Path == "" || route.Path[0] != '/':
		return nil, fmt.Errorf("hotroute: route %q %q: set a method and an absolute path", route.Method, route.Path)
	case route.MaxBodyBytes < 1 || route.MaxBodyBytes > 1<<20:
		return nil, fmt.Errorf("hotroute: route MaxBodyBytes = %d is outside 1..%d", route.MaxBodyBytes, 1<<20)
	case route.Handler == nil:
		return nil, errors.New("hotroute: route has no handler")
	case fallback == nil || fallback.ReadHeaderTimeout <= 0 || fallback.ReadTimeout <= 0 || fallback.WriteTimeout <= 0 || fallback.IdleTimeout <= 0:
		return nil, errors.New("hotroute: the fallback server needs every timeout set; build it with httpserver.New")
	}
	return &Server{
		route:    route,
		line:     []byte(route.Method + " " + route.Path + " HTTP/1.1\r\n"),
		fallback: fallback,
		conns:    make(map[*conn]struct{}),
	}, nil
}

// Served counts the requests the Server answered itself.
func (s *Server) Served() uint64 { return s.served.Load() }

// HandedOff counts the connections handed to the fallback server.
func (s *Server) HandedOff() uint64 { return s.handedOff.Load() }

// Serve accepts connections on ln until Shutdown, serving the route on
// each and handing the rest to the fallback server, which it runs
// meanwhile. It returns http.ErrServerClosed after Shutdown, or the
// listener's error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() || s.ln != nil {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.ln = ln
	s.handoff = newHandoffListener(ln.Addr())
	s.mu.Unlock()
	fallbackDone := make(chan error, 1)
	go func() { fallbackDone <- s.fallback.Serve(s.handoff) }()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err == nil {
			delay = 0
			go s.serveConn(nc)
			continue
		}
		if s.closing.Load() {
			<-fallbackDone
			return http.ErrServerClosed
		}
		// Running out of file descriptors is temporary: back off as
		// net/http does instead of spinning or giving up.
		if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		s.handoff.Close()
		<-fallbackDone
		return err
	}
}

// Shutdown stops accepting, closes idle connections, and waits until the
// requests in flight are answered and their connections closed, on both
// the Server and the fallback server, or until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.mu.Lock()
	ln, handoff := s.ln, s.handoff
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	if handoff != nil {
		handoff.Close()
	}
	fallbackDone := make(chan error, 1)
	go func() { fallbackDone <- s.fallback.Shutdown(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !s.closeIdle() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return <-fallbackDone
}

// closeIdle closes the connections waiting for a request and reports
// whether none is left.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.state.CompareAndSwap(stateIdle, stateClosed) {
			_ = c.nc.Close()
		}
	}
	return len(s.conns) == 0
}

// track registers c, or reports false once the Server is shutting down.
func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// logf logs through the fallback server's ErrorLog, where net/http logs
// its own connection errors.
func (s *Server) logf(format string, args ...any) {
	if s.fallback.ErrorLog != nil {
		s.fallback.ErrorLog.Printf(format, args...)
	}
}

// Connection states: a connection is closed by Shutdown only while idle.
const (
	stateIdle int32 = iota
	stateActive
	stateClosed
)

// conn is one connection served by the Server and everything it reuses
// from one request to the next.
type conn struct {
	s     *Server
	nc    net.Conn
	br    *bufio.Reader
	state atomic.Int32

	req  *http.Request
	url  url.URL
	hdr  http.Header
	vals []string
	body body
	w    answer
}

// newConn returns the state of a connection that reads from src (nc,
// but for tests) and whose peer is remote.
func (s *Server) newConn(nc net.Conn, src io.Reader, remote string) *conn {
	c := &conn{s: s, nc: nc, br: bufio.NewReaderSize(src, readBufferSize), hdr: make(http.Header, 8)}
	c.req = (&http.Request{
		Method:     s.route.Method,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		RemoteAddr: remote,
		RequestURI: s.route.Path,
	}).WithContext(context.Background())
	c.body.r = c.br
	c.w.hdr = make(http.Header, 4)
	return c
}

func (s *Server) serveConn(nc net.Conn) {
	c := s.newConn(nc, nc, nc.RemoteAddr().String())
	c.state.Store(stateActive)
	if !s.track(c) {
		_ = nc.Close()
		return
	}
	handedOff := false
	defer func() {
		if !handedOff {
			_ = nc.Close()
		}
		s.untrack(c)
	}()
	defer func() {
		if err := recover(); err != nil && err != http.ErrAbortHandler {
			stack := make([]byte, 64<<10)
			stack = stack[:runtime.Stack(stack, false)]
			s.logf("hotroute: panic serving %v: %v\n%s", nc.RemoteAddr(), err, stack)
		}
	}()
	for {
		c.state.Store(stateIdle)
		if s.closing.Load() {
			return
		}
		_ = nc.SetReadDeadline(time.Now().Add(s.fallback.IdleTimeout))
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		if !c.state.CompareAndSwap(stateIdle, stateActive) {
			return // closed by Shutdown
		}
		// The header and body deadlines matter only while the loop waits
		// for bytes; a request that arrived whole (the usual case: one
		// write of the client's) is served without setting them, which
		// saves two of the four deadline updates per request, each a
		// timer change in the runtime.
		start := time.Now()
		head, err := c.readHead(func() { _ = nc.SetReadDeadline(start.Add(s.fallback.ReadHeaderTimeout)) })
		if err != nil {
			return
		}
		if head == nil || !c.parse(head) {
			_ = nc.SetDeadline(time.Time{})
			// Counted first: the fallback may answer before give returns.
			s.handedOff.Add(1)
			if handedOff = s.handoff.give(&bufferedConn{Conn: nc, r: c.br}); !handedOff {
				s.handedOff.Add(^uint64(0))
			}
			return
		}
		_, _ = c.br.Discard(len(head))
		if int64(c.br.Buffered()) < c.body.n {
			_ = nc.SetReadDeadline(start.Add(s.fallback.ReadTimeout))
		}
		_ = nc.SetWriteDeadline(time.Now().Add(s.fallback.WriteTimeout))
		s.route.Handler.ServeHTTP(&c.w, c.req)
		// An unread rest of the body (at most MaxBodyBytes) is skipped so
		// that the next request starts where it should.
		if c.body.n > 0 {
			if _, err := c.br.Discard(int(c.body.n)); err != nil {
				return
			}
		}
		closing := s.closing.Load()
		s.served.Add(1) // counted first: the client may read the answer before Write returns
		if _, err := nc.Write(c.w.encode(closing)); err != nil || closing {
			return
		}
		c.w.shrink()
	}
}

// readHead returns the request's head (request line, headers and the
// blank line) from the buffer without consuming it, or nil when it is not
// of the plain form: longer than the buffer, or with a line that ends in
// a bare LF. Before it first waits for more bytes it calls beforeWait.
func (c *conn) readHead(beforeWait func()) ([]byte, error) {
	waited := false
	scanned := 0
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		for i := bytes.IndexByte(buf[scanned:], '\n'); i >= 0; i = bytes.IndexByte(buf[scanned:], '\n') {
			lf := scanned + i
			if lf == 0 || buf[lf-1] != '\r' {
				return nil, nil
			}
			if lf >= 3 && buf[lf-2] == '\n' && buf[lf-3] == '\r' || lf == 1 {
				return buf[:lf+1], nil
			}
			scanned = lf + 1
		}
		if len(buf) == c.br.Size() {
			return nil, nil
		}
		if !waited {
			beforeWait()
			waited = true
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

// parse fills the connection's request from head and reports whether it
// is the route in its plain form.
func (c *conn) parse(head []byte) bool {
	if !bytes.HasPrefix(head, c.s.line) {
		return false
	}
	// One string for the whole head: every header name and value is a
	// substring of it, so the headers cost a single allocation.
	h := string(head[len(c.s.line) : len(head)-2])
	clear(c.hdr)
	c.vals = c.vals[:0]
	var host string
	hosts, length := 0, int64(-1)
	for len(h) > 0 {
		end := strings.Index(h, "\r\n")
		if end < 0 {
			return false
		}
		line := h[:end]
		h = h[end+2:]
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return false // also an obs-fold line, which starts with a space
		}
		value := strings.Trim(line[colon+1:], " \t") // optional white space
		if !isFieldValue(value) {
			return false
		}
		// No allocation when the client sent the canonical form, as Go,
		// curl and most clients do.
		name := textproto.CanonicalMIMEHeaderKey(line[:colon])
		switch name {
		case "Content-Length":
			if length >= 0 {
				return false
			}
			n, ok := parseLength(value)
			if !ok || n > c.s.route.MaxBodyBytes {
				return false
			}
			length = n
		case "Host":
			// net/http moves Host out of the headers into Request.Host.
			if !isPlainHost(value) {
				return false
			}
			hosts++
			host = value
			continue
		case "Connection":
			// Python's clients, among others, say keep-alive, which
			// HTTP/1.1 means anyway; close or upgrade go to net/http.
			if !strings.EqualFold(value, "keep-alive") {
				return false
			}
		case "Transfer-Encoding", "Expect", "Upgrade", "Te", "Trailer":
			return false
		}
		c.vals = append(c.vals, value)
		if vs, ok := c.hdr[name]; ok {
			c.hdr[name] = append(vs, value)
		} else {
			n := len(c.vals)
			c.hdr[name] = c.vals[n-1 : n : n]
		}
	}
	if length < 0 || hosts != 1 {
		return false
	}
	c.url = url.URL{Path: c.s.route.Path}
	r := c.req
	r.URL = &c.url
	r.Header = c.hdr
	r.Host = host
	r.ContentLength = length
	c.body.n = length
	r.Body = &c.body
	r.Form, r.PostForm, r.MultipartForm, r.Trailer = nil, nil, nil, nil
	c.w.reset()
	return true
}

// body reads a request's Content-Length bytes from the connection.
type body struct {
	r *bufio.Reader
	n int64 // bytes left
}

func (b *body) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if err != nil && b.n > 0 {
		return n, io.ErrUnexpectedEOF
	}
	return n, nil
}

func (b *body) Close() error { return nil }

// bufferedConn is a handed-off connection: its reads start with the bytes
// the Server buffered but did not consume.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// handoffListener is the fallback server's listener: it yields the
// connections the Server hands off.
type handoffListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	addr  net.Addr
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{conns: make(chan net.Conn), done: make(chan struct{}), addr: addr}
}

// give passes c to the fallback server, or reports false once it stopped.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// parseLength parses a Content-Length value: 1 to 18 decimal digits.
func parseLength(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}

// answer is the ResponseWriter of the hot route: it buffers the answer
// and encode writes it whole.
type answer struct {
	hdr    http.Header
	status int
	body   []byte
	out    []byte
}

func (a *answer) reset() {
	clear(a.hdr)
	a.status = 0
	a.body = a.body[:0]
}

// keptAnswerBytes bounds the buffers an idle connection keeps from its
// last answer: thousands of keep-alive connections would otherwise each
// hold the largest answer they ever wrote.
const keptAnswerBytes = 16 << 10

// shrink drops buffers grown beyond keptAnswerBytes.
func (a *answer) shrink() {
	if cap(a.body) > keptAnswerBytes {
		a.body = nil
	}
	if cap(a.out) > keptAnswerBytes {
		a.out = nil
	}
}

func (a *answer) Header() http.Header { return a.hdr }

func (a *answer) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if a.status == 0 && code >= 200 {
		a.status = code
	}
}

func (a *answer) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	a.body = append(a.body, p...)
	return len(p), nil
}

// encode returns the whole answer: status line, headers (those the
// handler set, a Date, a Content-Type sniffed as net/http does when none
// was set, the Content-Length, and Connection: close when closing) and
// body.
func (a *answer) encode(closing bool) []byte {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	out := append(a.out[:0], "HTTP/1.1 "...)
	out = strconv.AppendInt(out, int64(a.status), 10)
	out = append(out, ' ')
	out = append(out, http.StatusText(a.status)...)
	out = append(out, "\r\n"...)
	bodyless := a.status == http.StatusNoContent || a.status == http.StatusNotModified
	for name, vs := range a.hdr {
		if !isToken(name) || name == "Content-Length" || name == "Transfer-Encoding" || name == "Connection" || (bodyless && name == "Content-Type") {
			continue
		}
		for _, v := range vs {
			out = append(out, name...)
			out = append(out, ": "...)
			out = appendFieldValue(out, v)
			out = append(out, "\r\n"...)
		}
	}
	if _, ok := a.hdr["Date"]; !ok {
		out = append(out, "Date: "...)
		out = append(out, httpDate()...)
		out = append(out, "\r\n"...)
	}
	if closing {
		out = append(out, "Connection: close\r\n"...)
	}
	if !bodyless {
		if _, ok := a.hdr["Content-Type"]; !ok && len(a.body) > 0 {
			out = append(out, "Content-Type: "...)
			out = append(out, http.DetectContentType(a.body)...)
			out = append(out, "\r\n"...)
		}
		out = append(out, "Content-Length: "...)
		out = strconv.AppendInt(out, int64(len(a.body)), 10)
		out = append(out, "\r\n\r\n"...)
		out = append(out, a.body...)
	} else {
		out = append(out, "\r\n"...)
	}
	a.out = out
	return out
}

// dateCache holds the Date header's value for the current second.
var dateCache atomic.Pointer[cachedDate]

type cachedDate struct {
	unix  int64
	value string
}

func httpDate() string {
	now := time.Now()
	if d := dateCache.Load(); d != nil && d.unix == now.Unix() {
		return d.value
	}
	d := &cachedDate{unix: now.Unix(), value: now.UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.value
}
