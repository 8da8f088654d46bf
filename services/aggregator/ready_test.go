package aggregator

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
)

// TestNotReadyWhileRestoringAssignedPartitions: an instance that was just
// assigned partitions counts nothing of them until their states are
// restored, so its readiness fails meanwhile (a rolling restart must not
// stop the next instance yet) and passes once they are. The restore is
// held at its start by the aggregator's lock, which onAssigned takes after
// counting the partitions it restores.
func TestNotReadyWhileRestoringAssignedPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kafka, ch := itest.Kafka(t), itest.ClickHouse(t)
	conn, err := chconn.Open(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := migrations.Apply(ctx, conn, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	pfile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pfile, []byte("defaults:\n  models:\n    \"*\": {monthly_tokens: 1000000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	watcher, err := policy.NewWatcher(pfile, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Group = itest.Unique(t, "agg_")
	topics := itest.Topics(t)
	cl, err := kafkaconn.NewClient(kafka)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := kafkaconn.EnsureTopics(ctx, cl, kafka, topics.Usage); err != nil {
		t.Fatal(err)
	}
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Topics: topics}
	a := newAggregator(cfg, env, watcher)
	a.admin = &adminFollower{}
	a.store = chstore.New(conn, a.costFunc, cfg.SlowCallMS)
	defer func() {
		for _, p := range a.parts {
			a.stop(p.w)
		}
	}()
	if err := a.partitionsReady(ctx); err != nil {
		t.Fatalf("ready before any assignment: %v", err)
	}

	a.mu.Lock()
	assigned := make(chan struct{})
	go func() {
		defer close(assigned)
		a.onAssigned(ctx, cl, map[string][]int32{topics.Usage: {0, 1}})
	}()
	itest.Eventually(t, 30*time.Second, "not ready while the assigned partitions are restored", func() bool {
		err := a.partitionsReady(ctx)
		return err != nil && strings.Contains(err.Error(), "2 assigned partitions are still being restored")
	})
	a.mu.Unlock()
	<-assigned
	if err := a.partitionsReady(ctx); err != nil {
		t.Errorf("not ready once the assigned partitions are restored: %v", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.parts) != 2 {
		t.Errorf("%d partitions restored, want 2", len(a.parts))
	}
}
