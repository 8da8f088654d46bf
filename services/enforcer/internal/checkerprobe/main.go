// Command checkerprobe is a test helper: a gateway Checker in its own
// process that reports on stdout when its decision for one tenant × model
// changes, so that tests can prove flags cross process boundaries through
// Redis alone.
//
// Output, one line each: "ready" once the first resync is done, then
// "refused <unix ns> <kind> <quota>" or "allowed <unix ns>" on each change.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/checker"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:16379", "redis address")
	prefix := flag.String("prefix", "sluice:flags:", "flags key prefix")
	tenant := flag.String("tenant", "", "tenant to watch")
	model := flag.String("model", "*", "model to watch")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rc := redisconn.Defaults()
	rc.Addr = *addr
	rdb := redisconn.NewClient(rc)
	defer rdb.Close()
	cfg := checker.DefaultConfig()
	cfg.KeyPrefix = *prefix
	c, err := checker.New(rdb, cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	go func() { _ = c.Run(ctx) }()
	out := bufio.NewWriter(os.Stdout)
	for !c.Synced() {
		if ctx.Err() != nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
	fmt.Fprintln(out, "ready")
	out.Flush()
	allowed := true
	for ctx.Err() == nil {
		d := c.Check(*tenant, *model, "")
		if d.Allowed() != allowed {
			allowed = d.Allowed()
			if allowed {
				fmt.Fprintf(out, "allowed %d\n", time.Now().UnixNano())
			} else {
				if d.Flag == nil {
					fmt.Fprintf(out, "refused %d stale -\n", time.Now().UnixNano())
				} else {
					fmt.Fprintf(out, "refused %d %s %s\n", time.Now().UnixNano(), d.Flag.Kind, d.Flag.Quota)
				}
			}
			out.Flush()
		}
		time.Sleep(200 * time.Microsecond)
	}
}
