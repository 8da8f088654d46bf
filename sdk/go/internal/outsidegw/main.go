// Command outsidegw is the smallest gateway a user would write against the
// SDK. TestOutsideModuleBuildsAGateway copies it into a module outside this
// repository, builds it and runs it: arguments are a Redis address and a
// flag key prefix (so the test shares no keys with anything else).
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

func main() {
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "outsidegw:", err)
		os.Exit(1)
	}
}

func run(redisAddr, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	layout := flags.Layout{Prefix: prefix}
	defer func() {
		rdb.Del(context.Background(), layout.TenantKey("leaky"), layout.VersionKey(), layout.HeartbeatKey())
	}()

	// Stand in for the enforcer: blacklist tenant "leaky" and beat.
	fl := &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Reason: "leaked key"}
	if err := rdb.HSet(ctx, layout.TenantKey("leaky"), flags.VersionField, 1, flags.AllModels, flags.Encode(fl)).Err(); err != nil {
		return err
	}
	if err := rdb.Set(ctx, layout.VersionKey(), 1, 0).Err(); err != nil {
		return err
	}
	if err := rdb.Set(ctx, layout.HeartbeatKey(), time.Now().UnixMilli(), time.Minute).Err(); err != nil {
		return err
	}

	cfg := checker.DefaultConfig()
	cfg.KeyPrefix = prefix
	chk, err := checker.New(rdb, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	// The checker stops before the client closes (defers run last first),
	// so no refresh is cut off by a closing pool.
	chkCtx, stopChecker := context.WithCancel(ctx)
	checkerDone := make(chan struct{})
	go func() { defer close(checkerDone); _ = chk.Run(chkCtx) }()
	defer func() { stopChecker(); <-checkerDone }()
	for !chk.Synced() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("checker never synced: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	for _, tenant := range []string{"leaky", "fine"} {
		d := chk.Check(tenant, "gpt-4o", "")
		if d.Allowed() {
			fmt.Printf("%s gpt-4o: allowed\n", tenant)
		} else {
			fmt.Printf("%s gpt-4o: refused (%s)\n", tenant, d.Flag.Kind)
		}
	}

	// Emit one event to a stand-in ingest that answers as ingest does.
	var got atomic.Int64
	ingest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer ingest.Close()
	em, err := emitter.New(&emitter.HTTPSender{URL: ingest.URL, APIKey: "k"}, emitter.DefaultConfig())
	if err != nil {
		return err
	}
	if err := em.Emit(&schemas.UsageEvent{ID: "e1", Time: time.Now(), Tenant: "fine", Model: "gpt-4o", PromptTokens: 10, CompletionTokens: 5}); err != nil {
		return err
	}
	if err := em.Close(ctx); err != nil {
		return err
	}
	fmt.Printf("emitted %d event\n", got.Load())
	return nil
}
