package itest

import (
	"net"
	"sync"
	"testing"
)

// handedOut are the ports FreeAddr returned in this process: the kernel
// may offer a released port again at once, and two services of one test
// given the same port fail to start (CI saw ingest's listen address
// handed out again for the aggregator's operational endpoints).
var handedOut struct {
	sync.Mutex
	ports map[string]bool
}

// FreeAddr is a loopback address whose port was free a moment ago, for a
// process a test starts, and never returned before in this test process:
// the port is released before it returns, so another process may take it
// first (rarely, on a busy machine).
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[string]bool{}
	}
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut.ports[addr] {
			handedOut.ports[addr] = true
			return addr
		}
	}
	t.Fatal("FreeAddr: the kernel offered only ports handed out before, 100 times")
	return ""
}
