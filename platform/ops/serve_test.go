package ops_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
)

// TestServeCutsOffSlowClients: the operational endpoints are often exposed
// to a scraper network; a client that sends a request's headers and never
// its body must lose the connection once ops.http.read_timeout passes,
// not hold it (and a goroutine) forever.
func TestServeCutsOffSlowClients(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	timeouts := httpserver.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Write: 300 * time.Millisecond, Idle: 300 * time.Millisecond}
	go func() {
		done <- ops.ServeListener(ctx, ln, timeouts, ops.NewRegistry(), ops.NewHealth(), slog.New(slog.DiscardHandler))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	}()

	for name, req := range map[string]string{
		"unfinished body":    "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
		"idle keep-alive":    "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
		"unfinished headers": "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ",
	} {
		t.Run(name, func(t *testing.T) { itest.ExpectCutOff(t, ln.Addr().String(), req) })
	}
}
