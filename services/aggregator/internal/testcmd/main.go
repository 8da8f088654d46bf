// Command testcmd runs one aggregator as a separate process, so the
// exactly-once test can kill it with SIGKILL at arbitrary moments. It is
// configured by flags and stops gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/services/aggregator"
	"github.com/sluicehq/sluice/services/aggregator/internal/faults"
)

func main() {
	cfg := aggregator.DefaultConfig()
	brokers := flag.String("brokers", "127.0.0.1:19092", "Kafka brokers")
	chAddr := flag.String("clickhouse", "127.0.0.1:19000", "ClickHouse native address")
	db := flag.String("database", "sluice", "ClickHouse database")
	topics := platform.DefaultTopics()
	flag.StringVar(&topics.Usage, "topic", topics.Usage, "usage topic")
	flag.StringVar(&topics.Signals, "signals", topics.Signals, "signals topic")
	flag.StringVar(&topics.Admin, "admin", topics.Admin, "admin topic")
	flag.StringVar(&cfg.Group, "group", cfg.Group, "consumer group")
	policyFile := flag.String("policy", "policy.yaml", "policy file")
	flag.IntVar(&cfg.BatchEvents, "batch", cfg.BatchEvents, "batch events")
	flag.DurationVar(&cfg.FlushInterval, "flush", 200*time.Millisecond, "flush interval")
	flag.DurationVar(&cfg.SessionTimeout, "session-timeout", 6*time.Second, "group session timeout")
	flag.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "snapshot interval (0: off)")
	flag.DurationVar(&cfg.ShutdownTimeout, "shutdown-grace", cfg.ShutdownTimeout, "shutdown grace (also the deadline of a flush on revoke)")
	keys := flag.String("signal-keys", "", "signal_auth keys, key_id:secret[,…]")
	fault := flag.String("fault", "", "step:mode:n — at the n-th time a flush reaches step (produce, write, commit), "+
		"fail it once (fail), send this process SIGTERM and cut the step short (term), SIGKILL this process (kill), "+
		"or block the step until its deadline (stall; only steps with a deadline are counted)")
	flag.Parse()

	k := kafkaconn.Defaults()
	k.Brokers = strings.Split(*brokers, ",")
	k.ClientID = "aggregator-testcmd"
	k.Partitions, k.ReplicationFactor = 3, 1
	c := chconn.Defaults()
	c.Addr, c.Database = *chAddr, *db
	env := platform.Env{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})), Kafka: k, ClickHouse: c, Topics: topics,
		SignalAuth: signalauth.Config{Keys: strings.Split(*keys, ",")}, Policy: platform.FileSource{File: *policyFile, Reload: platform.DefaultReload}}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *fault != "" {
		h, err := faultHook(ctx, *fault)
		if err != nil {
			fmt.Fprintln(os.Stderr, "aggregator:", err)
			os.Exit(2)
		}
		faults.Set(h)
	}
	svc, err := aggregator.New(cfg, env)
	if err == nil {
		err = svc.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggregator:", err)
		os.Exit(1)
	}
}

// faultHook parses -fault step:mode:n into the hook that acts at the n-th
// time a flush reaches step. root is the process's context, cancelled by
// SIGTERM.
func faultHook(root context.Context, spec string) (faults.Hook, error) {
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("-fault %q: want step:mode:n", spec)
	}
	step, mode := faults.Step(parts[0]), parts[1]
	n, err := strconv.Atoi(parts[2])
	if err != nil || n < 1 {
		return nil, fmt.Errorf("-fault %q: n must be a positive integer", spec)
	}
	switch mode {
	case "fail", "term", "kill", "stall":
	default:
		return nil, fmt.Errorf("-fault %q: mode must be fail, term, kill or stall", spec)
	}
	var mu sync.Mutex
	calls := 0
	return func(ctx context.Context, at faults.Step) error {
		if at != step {
			return nil
		}
		if _, ok := ctx.Deadline(); mode == "stall" && !ok {
			return nil
		}
		mu.Lock()
		calls++
		hit := calls == n
		mu.Unlock()
		if !hit {
			return nil
		}
		fmt.Fprintf(os.Stderr, "testcmd: fault %s at %s\n", mode, at)
		switch mode {
		case "fail":
			return errors.New("injected failure")
		case "kill":
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		case "stall":
			<-ctx.Done()
			return ctx.Err()
		}
		// term: the step is cut short by the stop it triggers.
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		<-root.Done()
		if err := ctx.Err(); err != nil {
			return err
		}
		return errors.New("cut short by SIGTERM")
	}, nil
}
