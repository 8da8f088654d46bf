package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/schemas"
)

// partitions is `sluicectl partitions`: it adds partitions to a topic the
// way docs/scaling.md "Adding partitions" describes, with the Kafka
// settings the services use (kafka.brokers, kafka.sasl, kafka.tls), so an
// operator needs no Kafka distribution's kafka-topics.sh (which
// scripts/services.sh does not install).
func init() {
	register("partitions", "show a topic's partition count, or raise it with -count (the usage topic by default)", runPartitions)
}

type partitionsConfig struct {
	Log   logging.Config   `yaml:"log"`
	Kafka kafkaconn.Config `yaml:"kafka"`
	Topic string           `yaml:"topic" help:"topic to show or grow"`
	Count int              `yaml:"count" help:"the partition count to raise the topic to (0: only show it); Kafka cannot lower it"`
}

func runPartitions(ctx context.Context, args []string) error {
	return runPartitionsTo(ctx, args, os.Stdout)
}

func runPartitionsTo(ctx context.Context, args []string, out io.Writer) error {
	cfg := partitionsConfig{Log: logging.Defaults(), Kafka: kafkaconn.Defaults(), Topic: schemas.TopicUsageV1}
	fs := flag.NewFlagSet("partitions", flag.ContinueOnError)
	if err := loadConfig(&cfg, fs, args); err != nil {
		return err
	}
	if cfg.Topic == "" {
		return errors.New("partitions: -topic: required")
	}
	if cfg.Count < 0 {
		return fmt.Errorf("partitions: -count: %d is negative", cfg.Count)
	}
	cl, err := kafkaconn.NewClient(cfg.Kafka)
	if err != nil {
		return fmt.Errorf("partitions: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, cfg.Topic)
	if err != nil {
		return fmt.Errorf("partitions: list %s: %w", cfg.Topic, err)
	}
	t, ok := td[cfg.Topic]
	if !ok || t.Err != nil {
		return fmt.Errorf("partitions: topic %s: not found on kafka.brokers %v", cfg.Topic, cfg.Kafka.Brokers)
	}
	have := len(t.Partitions)
	switch {
	case cfg.Count == 0 || cfg.Count == have:
		_, err = fmt.Fprintf(out, "%s: %d partitions\n", cfg.Topic, have)
		return err
	case cfg.Count < have:
		return fmt.Errorf("partitions: -count: %d is below the %d partitions %s has; Kafka cannot remove partitions", cfg.Count, have, cfg.Topic)
	}
	resp, err := adm.UpdatePartitions(ctx, cfg.Count, cfg.Topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("partitions: raise %s from %d to %d: %w", cfg.Topic, have, cfg.Count, err)
	}
	_, err = fmt.Fprintf(out, "%s: %d partitions (was %d); see docs/scaling.md \"Adding partitions\" for what the services do next\n", cfg.Topic, cfg.Count, have)
	return err
}
