package chstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// TestSnapshotStoredAndReadBack: a snapshot larger than a chunk reads
// back byte for byte; the newest complete one at or below the committed
// offset, of the right format and policy fingerprint, is the one read; an
// incomplete one (an insert cut short) and those of another format or
// fingerprint are ignored.
func TestSnapshotStoredAndReadBack(t *testing.T) {
	ctx, s := testStore(t, nil)
	if _, _, err := s.Snapshot(ctx, 0, 1000, 1, "fp"); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("empty table: %v, want ErrNoSnapshot", err)
	}
	big := make([]byte, SnapshotChunkBytes+1234)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	for _, w := range []struct {
		off    int64
		format uint16
		fp     string
		data   []byte
	}{
		{100, 1, "fp", big},
		{200, 1, "fp", []byte("at 200")},
		{300, 1, "other", []byte("other policy")},
		{300, 2, "fp", []byte("other format")},
	} {
		if err := s.WriteSnapshot(ctx, 0, w.off, w.format, w.fp, w.data); err != nil {
			t.Fatal(err)
		}
	}
	// A snapshot at 250 whose second chunk never arrived.
	half, err := s.conn.PrepareBatch(ctx, "INSERT INTO aggregator_snapshots (kafka_partition, kafka_offset, format, fingerprint, chunk, chunks, data, taken_at)")
	if err != nil {
		t.Fatal(err)
	}
	if err := half.Append(int32(0), int64(250), uint16(1), "fp", uint32(0), uint32(2), "half", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := half.Send(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		before int64
		want   []byte
		off    int64
	}{
		{150, big, 100},
		{200, []byte("at 200"), 200},
		{1000, []byte("at 200"), 200},
	} {
		data, off, err := s.Snapshot(ctx, 0, c.before, 1, "fp")
		if err != nil {
			t.Fatalf("before %d: %v", c.before, err)
		}
		if off != c.off || !bytes.Equal(data, c.want) {
			t.Errorf("before %d: snapshot at %d of %d bytes, want at %d of %d bytes", c.before, off, len(data), c.off, len(c.want))
		}
	}
	if _, _, err := s.Snapshot(ctx, 0, 99, 1, "fp"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("before every snapshot: %v, want ErrNoSnapshot", err)
	}
	if _, _, err := s.Snapshot(ctx, 1, 1000, 1, "fp"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("other partition: %v, want ErrNoSnapshot", err)
	}
}

// TestReplaySinceSeesTheLatestVersionOfIdsStoredSince: a state loaded
// from a snapshot covering offsets below from replays each id stored at or
// above from once, in its latest version below before — a settlement of an
// estimate stored before from included — and nothing else.
func TestReplaySinceSeesTheLatestVersionOfIdsStoredSince(t *testing.T) {
	ctx, s := testStore(t, nil)
	at := time.Date(2026, 2, 10, 3, 0, 0, 0, time.UTC)
	ev := func(id string, tokens int64, est bool, part int32, off int64) Event {
		return Event{UsageEvent: schemas.UsageEvent{ID: id, Time: at, Tenant: "acme", Model: "m", PromptTokens: tokens, Estimated: est}, Partition: part, Offset: off}
	}
	if err := s.Write(ctx, &Batch{Version: 1, Events: []Event{
		ev("a", 10, false, 0, 10),
		ev("b", 500, true, 0, 11), // estimate before the snapshot
		ev("b", 60, false, 0, 13), // its settlement after it
		ev("c", 7, false, 0, 14),
		ev("d", 9, false, 1, 13), // another partition
		ev("e", 5, false, 0, 15), // at the committed offset: not yet
	}}); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		id     string
		tokens int64
		off    int64
	}
	var got []seen
	n, err := s.ReplaySince(ctx, 0, 12, 15, func(e *schemas.UsageEvent, off int64) {
		got = append(got, seen{e.ID, e.PromptTokens, off})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []seen{{"b", 60, 13}, {"c", 7, 14}}
	if n != len(want) || len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("replayed %d: %v, want %v", n, got, want)
	}
}

// TestDropSnapshotsBefore: once a newer snapshot is stored and committed,
// the partition's older ones (of any format or fingerprint, complete or
// not) are deleted from ClickHouse, the newer one and other partitions'
// stay, and a restart at the committed offset still finds its snapshot.
func TestDropSnapshotsBefore(t *testing.T) {
	ctx, s := testStore(t, nil)
	for _, w := range []struct {
		part   int32
		off    int64
		format uint16
	}{{0, 100, 1}, {0, 200, 2}, {0, 300, 1}, {0, 400, 1}, {1, 100, 1}} {
		if err := s.WriteSnapshot(ctx, w.part, w.off, w.format, "fp", []byte(fmt.Sprint("at ", w.off))); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DropSnapshotsBefore(ctx, 0, 300)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("dropped %d snapshots, want the 2 below offset 300", n)
	}
	left := func(part int32) (offs []int64) {
		rows, err := s.conn.Query(ctx, "SELECT DISTINCT kafka_offset FROM aggregator_snapshots WHERE kafka_partition = ? ORDER BY kafka_offset", part)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var o int64
			if err := rows.Scan(&o); err != nil {
				t.Fatal(err)
			}
			offs = append(offs, o)
		}
		return offs
	}
	if got := left(0); fmt.Sprint(got) != "[300 400]" {
		t.Errorf("partition 0 keeps snapshots at %v, want [300 400]", got)
	}
	if got := left(1); fmt.Sprint(got) != "[100]" {
		t.Errorf("partition 1 keeps snapshots at %v, want [100]", got)
	}
	if data, off, err := s.Snapshot(ctx, 0, 350, 1, "fp"); err != nil || off != 300 || string(data) != "at 300" {
		t.Errorf("restart at 350: snapshot at %d %q %v, want the one at 300", off, data, err)
	}
	if n, err := s.DropSnapshotsBefore(ctx, 0, 300); err != nil || n != 0 {
		t.Errorf("dropping again: %d, %v; want nothing to drop", n, err)
	}
}
