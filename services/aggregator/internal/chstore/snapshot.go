package chstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Aggregator state snapshots (table aggregator_snapshots, migration 016).
//
// A snapshot is stored in chunks of SnapshotChunkBytes, all in one insert,
// after the batches whose events it covers; it is read back only when
// every chunk is there, so an insert cut short leaves at most an
// incomplete snapshot that Snapshot ignores.

// SnapshotChunkBytes is the size of one stored chunk of a snapshot.
const SnapshotChunkBytes = 8 << 20

// ErrNoSnapshot: no complete snapshot matches.
var ErrNoSnapshot = errors.New("no usable snapshot stored")

// WriteSnapshot stores data as the snapshot of partition covering its
// events below offset, in format format under policy fingerprint fp.
func (s *Store) WriteSnapshot(ctx context.Context, partition int32, offset int64, format uint16, fp string, data []byte) error {
	chunks := max((len(data)+SnapshotChunkBytes-1)/SnapshotChunkBytes, 1)
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO aggregator_snapshots (kafka_partition, kafka_offset, format, fingerprint, chunk, chunks, data, taken_at)")
	if err != nil {
		return fmt.Errorf("snapshot of partition %d: %w", partition, err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for i := range chunks {
		part := data[min(i*SnapshotChunkBytes, len(data)):min((i+1)*SnapshotChunkBytes, len(data))]
		if err := batch.Append(partition, offset, format, fp, uint32(i), uint32(chunks), string(part), now); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("snapshot of partition %d: %w", partition, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("snapshot of partition %d: %w", partition, err)
	}
	return nil
}

// Snapshot returns the newest complete snapshot of partition in format
// format under fingerprint fp that covers no event at or above before
// (the committed offset: a snapshot stored after its batches but before
// their commit is ahead of it), and the offset it covers. It answers
// ErrNoSnapshot when there is none.
func (s *Store) Snapshot(ctx context.Context, partition int32, before int64, format uint16, fp string) (data []byte, offset int64, err error) {
	var chunks uint32
	err = s.conn.QueryRow(ctx, `SELECT kafka_offset, n FROM
(SELECT kafka_offset, any(chunks) AS n, uniqExact(chunk) AS have FROM aggregator_snapshots
 WHERE kafka_partition = ? AND kafka_offset <= ? AND format = ? AND fingerprint = ?
 GROUP BY kafka_offset)
WHERE have = n ORDER BY kafka_offset DESC LIMIT 1`, partition, before, format, fp).Scan(&offset, &chunks)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, 0, ErrNoSnapshot
		}
		return nil, 0, fmt.Errorf("snapshot of partition %d: %w", partition, err)
	}
	rows, err := s.conn.Query(ctx, `SELECT chunk, any(data) FROM aggregator_snapshots
WHERE kafka_partition = ? AND kafka_offset = ? AND format = ? AND fingerprint = ?
GROUP BY chunk ORDER BY chunk`, partition, offset, format, fp)
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot of partition %d: %w", partition, err)
	}
	defer rows.Close()
	// Sized for every chunk at once (a damaged count is not trusted beyond
	// 2 GB: the slice grows past it as the chunks arrive).
	data = make([]byte, 0, int(min(chunks, 256))*SnapshotChunkBytes)
	for want := uint32(0); rows.Next(); want++ {
		var chunk uint32
		var part string
		if err := rows.Scan(&chunk, &part); err != nil {
			return nil, 0, fmt.Errorf("snapshot of partition %d: %w", partition, err)
		}
		if chunk != want {
			return nil, 0, fmt.Errorf("snapshot of partition %d at %d: chunk %d missing", partition, offset, want)
		}
		data = append(data, part...)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("snapshot of partition %d: %w", partition, err)
	}
	return data, offset, nil
}

// ReplaySince calls fn, in offset order, with each distinct event of
// partition whose latest version below before is at or above from: what
// a state loaded from a snapshot covering from must replay to reach
// before. Those are exactly the ids with a row in [from, before): a
// version stored since from has a higher offset than any stored before
// it, so the latest version of such an id is among the rows since from,
// and only they are read and grouped (the month's rows of the partition
// are filtered by their offset column alone, not read and grouped by id).
// Events of the partition's tenants stored under other partitions are
// not read: a restart after the topic gained partitions rebuilds in full.
func (s *Store) ReplaySince(ctx context.Context, partition int32, from, before int64, fn func(ev *schemas.UsageEvent, offset int64)) (int, error) {
	if from >= before {
		return 0, nil
	}
	where := fmt.Sprintf("kafka_partition = %d AND kafka_offset >= %d AND kafka_offset < %d", partition, from, before)
	n, err := s.scan(ctx, fmt.Sprintf(tenantEvents, where, partition, partition), fn)
	if err != nil {
		return n, fmt.Errorf("replay partition %d since %d: %w", partition, from, err)
	}
	return n, nil
}

// DropSnapshotsBefore deletes partition's snapshots that cover less than
// offset (any format or policy fingerprint): call it once a snapshot at
// offset is stored and an offset at or past it committed, so that a
// restart at the committed offset no longer needs them. Each snapshot is
// a ClickHouse partition of its own (migration 017), dropped at once.
func (s *Store) DropSnapshotsBefore(ctx context.Context, partition int32, offset int64) (int, error) {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT kafka_offset FROM aggregator_snapshots WHERE kafka_partition = ? AND kafka_offset < ?", partition, offset)
	if err != nil {
		return 0, fmt.Errorf("old snapshots of partition %d: %w", partition, err)
	}
	var offs []int64
	for rows.Next() {
		var o int64
		if err := rows.Scan(&o); err != nil {
			rows.Close()
			return 0, fmt.Errorf("old snapshots of partition %d: %w", partition, err)
		}
		offs = append(offs, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("old snapshots of partition %d: %w", partition, err)
	}
	for i, o := range offs {
		if err := s.conn.Exec(ctx, fmt.Sprintf("ALTER TABLE aggregator_snapshots DROP PARTITION (%d, %d)", partition, o)); err != nil {
			return i, fmt.Errorf("drop the snapshot of partition %d at %d: %w", partition, o, err)
		}
	}
	return len(offs), nil
}

// sinceEvent is an event stored after a snapshot, read while the snapshot
// loads.
type sinceEvent struct {
	ev  schemas.UsageEvent
	off int64
}

// replayBuffer bounds the events read ahead while a snapshot loads.
const replayBuffer = 65536

// LoadPartition restores partition's state as of before (its committed
// offset) from its newest usable snapshot and the events stored since:
// tally.Load under pol, then prepare (the caller sets the clock and the
// overrides in force), then ReplaySince in replay mode (its query runs
// while the snapshot loads). It answers
// ErrNoSnapshot, or tally's ErrSnapshotMismatch or ErrSnapshotCorrupt
// (wrapped), when the caller must rebuild in full instead.
func (s *Store) LoadPartition(ctx context.Context, partition int32, before int64, opt tally.Options, pol *policy.Policy, prepare func(st *tally.Partition)) (*tally.Partition, int, error) {
	fp := pol.Fingerprint()
	data, off, err := s.Snapshot(ctx, partition, before, tally.SnapshotVersion, fp)
	if err != nil {
		return nil, 0, err
	}
	// The query for the events since the snapshot runs while the snapshot
	// loads: ClickHouse scans and groups on its own core meanwhile. Its
	// rows wait in a bounded buffer until the state is ready for them.
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	since := make(chan sinceEvent, replayBuffer)
	qerr := make(chan error, 1)
	go func() {
		defer close(since)
		_, err := s.ReplaySince(qctx, partition, off, before, func(ev *schemas.UsageEvent, o int64) {
			select {
			case since <- sinceEvent{*ev, o}:
			case <-qctx.Done():
			}
		})
		qerr <- err
	}()
	st, err := tally.Load(partition, opt, pol, fp, data)
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot of partition %d at %d: %w", partition, off, err)
	}
	st.SetReplay(true)
	prepare(st)
	n := 0
	for e := range since {
		st.Apply(&e.ev, e.off)
		n++
	}
	if err := <-qerr; err != nil {
		return nil, n, err
	}
	st.SetReplay(false)
	st.ClearDirty()
	st.TakeSignals()
	return st, n, nil
}
