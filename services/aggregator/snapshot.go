package aggregator

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/services/aggregator/internal/chstore"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Snapshots (services.aggregator.snapshot_interval).
//
// Every interval a partition's state is snapshotted right after a drain
// (consumer.go, snapshot) and stored by its writer after the batches it
// covers and before their offset is committed (writer.go, storeSnapshot).
// A newly assigned partition loads the newest snapshot at or below its
// committed offset taken under the policy in force, and replays only the
// events stored since; with no such snapshot, or a damaged one, or after
// the topic gained partitions (moved tenants' events are on other
// partitions), it rebuilds in full, logged and counted in
// sluice_aggregator_snapshot_fallbacks_total{reason}.

// loadSnapshot restores partition id, committed at before, from its
// newest usable snapshot and the events stored since. It reports false
// (and the caller rebuilds in full) when snapshots are off or none is
// usable.
func (a *aggregator) loadSnapshot(ctx context.Context, id int32, before int64) (*tally.Partition, int, bool) {
	if a.cfg.SnapshotInterval <= 0 {
		return nil, 0, false
	}
	fallback := func(reason string, err error) (*tally.Partition, int, bool) {
		a.m.snapshotFallbacks.WithLabelValues(reason).Inc()
		if reason == "none" {
			a.log.Info("no snapshot of the partition stored: rebuilding from the events", "partition", id, "resume_offset", before)
		} else {
			a.log.Warn("partition snapshot not usable: rebuilding from the events", "partition", id, "resume_offset", before, "reason", reason, "err", err)
		}
		return nil, 0, false
	}
	n := int(a.nparts.Load())
	for c := range a.pastCounts {
		if c != 0 && c != n {
			return fallback("repartitioned", nil)
		}
	}
	now := time.Now()
	st, replayed, err := a.store.LoadPartition(ctx, id, before, a.cfg.options(), a.watcher.Current(), func(st *tally.Partition) {
		st.SetClock(now)
		for _, tn := range st.OverriddenTenants() {
			st.SetOverrides(tn, nil) // lifted since the snapshot unless installed again below
		}
		a.installOverrides(st, now)
	})
	switch {
	case errors.Is(err, chstore.ErrNoSnapshot):
		return fallback("none", err)
	case errors.Is(err, tally.ErrSnapshotMismatch):
		return fallback("mismatch", err)
	case errors.Is(err, tally.ErrSnapshotCorrupt):
		return fallback("corrupt", err)
	case err != nil:
		return fallback("error", err)
	}
	return st, replayed, true
}
