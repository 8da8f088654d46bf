package itest

import (
	"net"
	"testing"
)

// FreeAddr is a loopback address whose port was free a moment ago, for a
// process a test starts: the port is released before it returns, so
// another process may take it first (rarely, on a busy machine).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
