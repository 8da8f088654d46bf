package enforcer

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// consume feeds the core every record of the signals topic until ctx
// ends, starting once recovery is done (or recoveryWait has passed; see
// recovery.go for why). Fetch errors are logged and retried by the client:
// the consumer group and its committed offsets, not this loop, decide what
// is read again after a failure. Each partition's progress is recorded
// once its records are handled; it is committed only once their flags
// are in Redis (commit.go).
func (c *core) consume(ctx context.Context, kc *kgo.Client, recovered <-chan struct{}) error {
	if !awaitRecovery(ctx, recovered, recoveryWait, c.log) {
		return nil
	}
	for ctx.Err() == nil {
		fs := kc.PollFetches(ctx)
		now := time.Now()
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("enforcer: fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range p.Records {
				c.handleSignalRecord(r, now)
			}
			if n := len(p.Records); n > 0 {
				last := p.Records[n-1]
				c.offsets.handled(p.Partition, last.Offset+1, last.LeaderEpoch)
			}
		})
	}
	return nil
}
