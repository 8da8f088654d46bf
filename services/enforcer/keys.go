package enforcer

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/controlplane"
)

// applyKey folds a control-plane record (an API key) into the replica's
// keys; the gateways follow the same records themselves.
func (a *adminState) applyKey(r *kgo.Record) {
	res := a.keys.Apply(r)
	a.records.WithLabelValues("key_" + string(res.Outcome)).Inc()
	switch res.Outcome {
	case controlplane.Stale, controlplane.Unauthenticated, controlplane.Invalid:
		if n := a.refused.Add(1); n <= 10 || n%1000 == 0 {
			a.log.Warn("enforcer: refusing a control-plane record; its key stays as it was", "result", res.Outcome,
				"err", res.Err, "offset", r.Offset, "refused_so_far", n)
		}
	}
}

// Key returns key id as this replica holds it, or nil.
func (a *adminState) Key(id string) *controlplane.Key { return a.keys.Key(id) }

// Keys returns the keys of tenant ("" every tenant).
func (a *adminState) Keys(tenant string) []*controlplane.Key { return a.keys.Keys(tenant) }

// Synced returns once the records present at start are applied.
func (a *adminState) Synced(ctx context.Context) error {
	select {
	case <-a.caughtUp():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PutKey writes k as the version after read (0: a new key) and returns
// once the broker acknowledged it and this replica applied it. It refuses
// with controlplane.ErrStale a change that read an older version than the
// one in force — on this replica after reading the topic to its end, or
// on the topic, when another replica wrote the same version first (the
// losing record is then tombstoned).
func (a *adminState) PutKey(ctx context.Context, k *controlplane.Key, read uint64, request string) error {
	a.pubMu.Lock()
	defer a.pubMu.Unlock()
	if err := a.catchUpNow(ctx); err != nil {
		return fmt.Errorf("reading %s before writing to it: %w", a.topic, err)
	}
	var cur uint64
	if in := a.keys.Key(k.ID); in != nil {
		cur = in.Version
	}
	if cur != read {
		return fmt.Errorf("%w: key %s is at version %d, the change read version %d", controlplane.ErrStale, k.ID, cur, read)
	}
	k.Version = read + 1
	rec := &controlplane.Record{Kind: controlplane.KindKey, Key: k, Request: request}
	krs, err := a.keys.Records(a.topic, rec)
	if err != nil {
		return err
	}
	res := a.kc.ProduceSync(ctx, krs...)
	if err := res.FirstErr(); err != nil {
		return fmt.Errorf("produce to %s: %w", a.topic, err)
	}
	for _, r := range res {
		if err := a.waitApplied(ctx, r.Record.Partition, r.Record.Offset); err != nil {
			return fmt.Errorf("acknowledged by the broker but not yet applied here: %w", err)
		}
	}
	if !a.keys.InForce(rec.ID(), krs[0].Key) {
		// Another replica's change of the same version came first: ours
		// is refused by every reader; the tombstone lets compaction drop it.
		_ = a.kc.ProduceSync(ctx, a.keys.Tombstone(a.topic, krs[0].Key)).FirstErr()
		return fmt.Errorf("%w: another change of key %s was written at the same time", controlplane.ErrStale, k.ID)
	}
	return nil
}
