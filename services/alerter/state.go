package alerter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/services/alerter/engine"
)

// DefaultStateTopic is the compacted topic that holds the alerter's alert
// states (see stateStore) for the default consumer group. It belongs to
// one group: Config.stateTopic derives another name for other groups.
const DefaultStateTopic = "sluice.alerter.state.v1"

// stateStore keeps the engine's alert states on a compacted Kafka topic,
// one record per alert key (a nil value deletes it), co-partitioned with
// the signals topic: the state of the tenants of signals partition p lives
// in state partition p. A replica that is assigned signals partition p
// reads state partition p before it consumes p's signals, so ownership of
// the state moves with the consumer group's assignment and no replica ever
// acts on another's alerts.
//
// Every record is signed (signalauth.AlerterState, the signal_auth key
// ring) and verified on load, deletions included: anyone who could produce
// to the topic could otherwise silence an alert (a forged state saying it
// was notified, or a forged deletion that makes the next replica page
// again) or have a channel post any text (a forged held notification is
// sent as it is). A refused record is skipped and counted and the key keeps
// its last authentic state. Record keys are derived from the alert key
// under the signing key (signalauth's RecordKey): compaction keeps the
// last record of each record key whoever wrote it, so with the alert key
// itself a forged tombstone, refused on load, would still make the broker
// drop the genuine state. State written by a release that did not sign
// is refused too unless signal_auth.accept_unsigned_state is on (a
// migration: otherwise a restart after the upgrade forgets what was
// notified, and may notify a firing alert once more).
type stateStore struct {
	topic string
	kcfg  kafkaconn.Config
	// cl is the alerter's group client; it produces with the manual
	// partitioner, so a record goes to the partition it names.
	cl  *kgo.Client
	log *slog.Logger
	// auth signs what save writes and verifies what load reads;
	// refused and unsigned count the records load refused, and the
	// unsigned ones it admitted under accept_unsigned_state.
	auth                *signalauth.Auth
	refused, unsigned   prometheus.Counter
	refusedN, unsignedN atomic.Int64
	// partitions is the state topic's partition count: a record for a
	// partition beyond it would fail the whole write.
	partitions int32
	// undecodable counts records skipped on load.
	undecodable atomic.Int64

	// heldMu guards held: the (partition, channel) pairs whose held
	// notifications are stored, so that a group that flushed gets its
	// records deleted.
	heldMu sync.Mutex
	held   map[int32]map[string]bool
}

// heldPrefix starts the keys of held-notification records; alert keys
// never start with a NUL byte.
const heldPrefix = "\x00held\x00"

// restored is one record read back and the partition it came from: an
// alert's state, or a channel's held notifications.
type restored struct {
	part int32
	rec  *engine.Record
	held *engine.Held
}

// ensureStateTopic creates the state topic, compacted, with at least as
// many partitions as the signals topic, or checks that the existing one
// has enough. It returns the state topic's partition count.
func ensureStateTopic(ctx context.Context, cl *kgo.Client, kcfg kafkaconn.Config, signals, state string) (int32, error) {
	for attempt := 1; ; attempt++ {
		n, err := ensureStateTopicOnce(ctx, cl, kcfg, signals, state)
		// Another replica created it at the same time, and the metadata
		// does not show it yet (franz-go serves metadata up to 5s old):
		// look again for a little longer than that.
		if !errors.Is(err, kerr.TopicAlreadyExists) || attempt == 15 {
			return n, err
		}
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func ensureStateTopicOnce(ctx context.Context, cl *kgo.Client, kcfg kafkaconn.Config, signals, state string) (int32, error) {
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, signals, state)
	if err != nil {
		return 0, fmt.Errorf("services.alerter.state_topic: listing %s and %s: %w", signals, state, err)
	}
	need := int32(len(td[signals].Partitions))
	if st, ok := td[state]; ok && st.Err == nil && len(st.Partitions) > 0 {
		if int32(len(st.Partitions)) < need {
			return 0, fmt.Errorf("services.alerter.state_topic: %s has %d partitions, fewer than the %d of %s; it must have at least as many (add partitions to it, or name a new state topic)",
				state, len(st.Partitions), need, signals)
		}
		return int32(len(st.Partitions)), nil
	}
	compact := "compact"
	n := max(need, kcfg.Partitions)
	_, err = adm.CreateTopic(ctx, n, kcfg.ReplicationFactor, kafkaconn.TopicConfigs(ctx, adm, kcfg, map[string]*string{"cleanup.policy": &compact}), state)
	if err != nil {
		return 0, fmt.Errorf("services.alerter.state_topic: create %s: %w", state, err)
	}
	return n, nil
}

// load reads partitions parts of the state topic up to their current end
// and returns the last record of every key still present.
func (s *stateStore) load(ctx context.Context, parts []int32) ([]restored, error) {
	if len(parts) == 0 {
		return nil, nil
	}
	adm := kadm.NewClient(s.cl)
	starts, err := adm.ListStartOffsets(ctx, s.topic)
	if err != nil {
		return nil, fmt.Errorf("state topic %s: start offsets: %w", s.topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, s.topic)
	if err != nil {
		return nil, fmt.Errorf("state topic %s: end offsets: %w", s.topic, err)
	}
	want := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	for _, p := range parts {
		end, ok := ends.Lookup(s.topic, p)
		if !ok || end.Err != nil {
			return nil, fmt.Errorf("state topic %s: no end offset for partition %d (does it have fewer partitions than the signals topic?)", s.topic, p)
		}
		start, _ := starts.Lookup(s.topic, p)
		if end.Offset > start.Offset {
			want[p] = end.Offset
			from[p] = kgo.NewOffset().AtStart()
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	rd, err := kafkaconn.NewClient(s.kcfg, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: from}))
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	// live holds the last record of every record key; a state written
	// before and after a key rotation (or a release that did not derive
	// keys) has several, and the last one read of its alert key wins.
	type entry struct {
		logical string
		got     restored
		seq     int
	}
	live := map[string]entry{}
	seq := 0
	for len(want) > 0 {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			ferr = fmt.Errorf("state topic %s partition %d: %w", s.topic, p, err)
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
			if !s.authentic(r) {
				return
			}
			key := string(r.Key)
			if r.Value == nil {
				delete(live, key)
				return
			}
			if logical, got, ok := s.decode(r); ok {
				seq++
				live[key] = entry{logical, got, seq}
			}
		})
	}
	latest := map[string]entry{}
	for _, e := range live {
		if l, ok := latest[e.logical]; !ok || e.seq > l.seq {
			latest[e.logical] = e
		}
	}
	out := make([]restored, 0, len(latest))
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	for _, e := range latest {
		out = append(out, e.got)
		if e.got.held != nil {
			s.markHeld(e.got.part, e.got.held.Channel)
		}
	}
	return out, nil
}

// decode returns the alert state or held notifications r carries and its
// logical key (the alert key, or heldPrefix and the channel); ok is false
// for a record it skipped (logged and counted).
func (s *stateStore) decode(r *kgo.Record) (logical string, got restored, ok bool) {
	var v int
	var err error
	got.part = r.Partition
	// The key no longer says which of the two a record is: an alert state
	// always names its tenant, held notifications never do.
	got.rec = new(engine.Record)
	if err = json.Unmarshal(r.Value, got.rec); err == nil {
		v, logical = got.rec.V, got.rec.Key.String()
		if got.rec.Key.Tenant == "" {
			got.rec, got.held = nil, new(engine.Held)
			if err = json.Unmarshal(r.Value, got.held); err == nil {
				v, logical = got.held.V, heldPrefix+got.held.Channel
			}
		}
	}
	if err != nil || v != engine.RecordVersion {
		if n := s.undecodable.Add(1); n <= 10 || n%1000 == 0 {
			s.log.Warn("alert state record skipped", "partition", r.Partition, "offset", r.Offset, "version", v, "err", err)
		}
		return "", restored{}, false
	}
	return logical, got, true
}

// authentic reports whether load may use r (see stateStore), and counts
// and logs it when not: the first ten, then every thousandth, so a flood
// of forgeries cannot bury the log.
func (s *stateStore) authentic(r *kgo.Record) bool {
	unsigned, err := s.auth.Admit(r)
	if err != nil {
		s.refused.Inc()
		if n := s.refusedN.Add(1); n <= 10 || n%1000 == 0 {
			s.log.Warn("refusing an unauthenticated alert state record; the alert keeps its last authentic state", "reason", signalauth.Reason(err),
				"partition", r.Partition, "offset", r.Offset, "refused_so_far", n)
		}
		return false
	}
	if unsigned {
		s.unsigned.Inc()
		if n := s.unsignedN.Add(1); n <= 10 || n%1000 == 0 {
			s.log.Warn("using an unsigned alert state record (signal_auth.accept_unsigned_state)", "partition", r.Partition, "offset", r.Offset, "unsigned_so_far", n)
		}
	}
	return true
}

// records returns the signed records that store value as the state of
// logical (an alert key, or heldPrefix and a channel) on partition part,
// under its derived record key; for a nil value, the tombstones that
// delete it under every record key it may have been written with (each
// key of the ring, and logical itself for a release that did not derive
// keys), so that no older copy comes back on load.
func (s *stateStore) records(part int32, logical string, value []byte) []*kgo.Record {
	keys := [][]byte{s.auth.RecordKey([]byte(logical))}
	if value == nil {
		keys = s.auth.RecordKeys([]byte(logical))
	}
	out := make([]*kgo.Record, len(keys))
	for i, k := range keys {
		out[i] = s.auth.Record(s.topic, k, value)
		out[i].Partition = part
	}
	return out
}

func (s *stateStore) markHeld(part int32, ch string) {
	if s.held == nil {
		s.held = map[int32]map[string]bool{}
	}
	if s.held[part] == nil {
		s.held[part] = map[string]bool{}
	}
	s.held[part][ch] = true
}

// forget drops what the store knows of partitions this replica lost.
func (s *stateStore) forget(parts []int32) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	for _, p := range parts {
		delete(s.held, p)
	}
}

// save writes changes (acks=all) to the partitions partOf names for their
// tenants, and, when heldChanged, replaces the stored held notifications
// with held: one record per partition and channel with the notices of that
// partition's tenants, a deletion for every pair no longer held. A change
// for a tenant without a known partition is skipped and logged: it cannot
// be restored by whoever owns the tenant. It returns the records written.
func (s *stateStore) save(ctx context.Context, changes []engine.Change, held []engine.Held, heldChanged bool,
	partOf func(tenant string) (int32, bool)) (int, error) {
	recs := make([]*kgo.Record, 0, len(changes))
	for _, c := range changes {
		part, ok := partOf(c.Key.Tenant)
		if !ok || part >= s.partitions {
			s.log.Warn("alert state not saved: the tenant's signals partition is unknown or beyond the state topic's partitions (restart the alerter after adding partitions)",
				"alert", c.Key.String(), "partition", part, "state_partitions", s.partitions)
			continue
		}
		var value []byte
		if c.Record != nil {
			var err error
			if value, err = json.Marshal(c.Record); err != nil {
				return 0, fmt.Errorf("alert state %s: %w", c.Key.String(), err)
			}
		}
		recs = append(recs, s.records(part, c.Key.String(), value)...)
	}
	var now map[int32]map[string]bool
	if heldChanged {
		now = map[int32]map[string]bool{}
		for _, h := range held {
			byPart := map[int32]*engine.Held{}
			for _, a := range h.Alerts {
				part, ok := partOf(a.Key.Tenant)
				if !ok || part >= s.partitions {
					continue
				}
				if byPart[part] == nil {
					byPart[part] = &engine.Held{V: h.V, Channel: h.Channel, First: h.First}
				}
				byPart[part].Alerts = append(byPart[part].Alerts, a)
			}
			for part, ph := range byPart {
				value, err := json.Marshal(ph)
				if err != nil {
					return 0, fmt.Errorf("held notifications of %s: %w", h.Channel, err)
				}
				if now[part] == nil {
					now[part] = map[string]bool{}
				}
				now[part][h.Channel] = true
				recs = append(recs, s.records(part, heldPrefix+h.Channel, value)...)
			}
		}
		s.heldMu.Lock()
		for part, chans := range s.held {
			for ch := range chans {
				if !now[part][ch] {
					recs = append(recs, s.records(part, heldPrefix+ch, nil)...)
				}
			}
		}
		s.heldMu.Unlock()
	}
	if len(recs) == 0 {
		return 0, nil
	}
	if err := s.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, err
	}
	if heldChanged {
		s.heldMu.Lock()
		s.held = now
		s.heldMu.Unlock()
	}
	return len(recs), nil
}
