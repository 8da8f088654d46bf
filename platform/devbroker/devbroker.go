// Package devbroker starts franz-go's in-process fake Kafka broker for
// development (`make run` with no kafka.brokers configured). It lives apart
// from kafkaconn so that nothing which imports kafkaconn — the gateway SDK's
// Kafka sender in particular — links the fake broker.
package devbroker

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Start starts franz-go's in-process fake broker on 127.0.0.1:port,
// persisting to dataDir when it is not empty, and returns it with its
// address. It exists so `make run` works on a machine with no Kafka; it has
// no replication and enforces no quotas, and the integration tests never use
// it. Close the cluster to stop it.
func Start(port int, dataDir string, topics ...string) (*kfake.Cluster, []string, error) {
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.DefaultNumPartitions(6)}
	if dataDir != "" {
		opts = append(opts, kfake.DataDir(dataDir))
	}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(6, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: start embedded broker on port %d: %w", port, err)
	}
	return c, c.ListenAddrs(), nil
}
