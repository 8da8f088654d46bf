// Command testcmd runs one aggregator as a separate process, so the
// exactly-once test can kill it with SIGKILL at arbitrary moments. It is
// configured by flags and stops gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/services/aggregator"
)

func main() {
	cfg := aggregator.DefaultConfig()
	brokers := flag.String("brokers", "127.0.0.1:19092", "Kafka brokers")
	chAddr := flag.String("clickhouse", "127.0.0.1:19000", "ClickHouse native address")
	db := flag.String("database", "sluice", "ClickHouse database")
	flag.StringVar(&cfg.Topic, "topic", cfg.Topic, "usage topic")
	flag.StringVar(&cfg.SignalsTopic, "signals", cfg.SignalsTopic, "signals topic")
	flag.StringVar(&cfg.AdminTopic, "admin", cfg.AdminTopic, "admin topic")
	flag.StringVar(&cfg.Group, "group", cfg.Group, "consumer group")
	policyFile := flag.String("policy", "policy.yaml", "policy file")
	flag.IntVar(&cfg.BatchEvents, "batch", cfg.BatchEvents, "batch events")
	flag.DurationVar(&cfg.FlushInterval, "flush", 200*time.Millisecond, "flush interval")
	flag.DurationVar(&cfg.SessionTimeout, "session-timeout", 6*time.Second, "group session timeout")
	flag.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "snapshot interval (0: off)")
	keys := flag.String("signal-keys", "", "signal_auth keys, key_id:secret[,…]")
	flag.Parse()

	k := kafkaconn.Defaults()
	k.Brokers = strings.Split(*brokers, ",")
	k.ClientID = "aggregator-testcmd"
	k.Partitions, k.ReplicationFactor = 3, 1
	c := chconn.Defaults()
	c.Addr, c.Database = *chAddr, *db
	env := platform.Env{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})), Kafka: k, ClickHouse: c,
		SignalAuth: signalauth.Config{Keys: strings.Split(*keys, ",")}, Policy: platform.FileSource{File: *policyFile, Reload: platform.DefaultReload}}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := aggregator.Run(ctx, cfg, env); err != nil {
		fmt.Fprintln(os.Stderr, "aggregator:", err)
		os.Exit(1)
	}
}
