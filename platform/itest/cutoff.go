package itest

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// ExpectCutOff dials addr, writes raw (a request the client never
// finishes, or one after which it idles on keep-alive) and reads until
// the server closes the connection. It fails t if the server still holds
// the connection after 20 seconds: far beyond the timeouts a test sets,
// so only a missing timeout trips it.
func ExpectCutOff(t testing.TB, addr, raw string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server still holds the connection after 20s; a timeout is missing (sent %q)", raw)
	}
}
