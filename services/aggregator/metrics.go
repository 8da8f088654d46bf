package aggregator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/policy"
)

// metrics are the aggregator's Prometheus collectors.
type metrics struct {
	accepted, duplicates, rejected, invalid, late prometheus.Counter
	held, released, tooFarAhead                   prometheus.Counter
	heldNow                                       prometheus.Gauge
	adminInvalid                                  prometheus.Counter
	adminRefused, adminUnsigned, adminReplayed    prometheus.Counter
	restoreAnnouncements                          prometheus.Counter
	wrongSchema, rerouted                         prometheus.Counter
	signals                                       *prometheus.CounterVec
	lag                                           *prometheus.GaugeVec
	series, ids                                   prometheus.Gauge
	writeRows, writeSeconds, rebuildSeconds       prometheus.Histogram
	writeErrors                                   *prometheus.CounterVec
	commitErrors, rebuildEvents                   prometheus.Counter
	evictions, restores, reevaluations            prometheus.Counter
	restoreSeconds                                prometheus.Histogram
	unwritten                                     prometheus.Gauge
	fetchPauses                                   prometheus.Counter
	flushesCut                                    prometheus.Counter
	modelsCapped                                  prometheus.Counter
	handoverWaits                                 *prometheus.HistogramVec
	snapshots, snapshotFallbacks                  *prometheus.CounterVec
	snapshotSeconds, snapshotPause, snapshotCopy  prometheus.Histogram
	snapshotsDropped                              prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, w *policy.Watcher) *metrics {
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_aggregator_events_total", Help: "Usage events read, by result: counted, duplicate id, rejected (model \"*\"), invalid (undecodable), wrong_schema (header schema missing or not sluice.usage.v1), rerouted (found off the tenant's home partition and produced there, counted there), held (stamped beyond max_event_future; counted when released), released (held events counted since; also in counted), too_far_ahead (ahead with the hold full: refused)."}, []string{"result"})
	m := &metrics{
		accepted:             events.WithLabelValues("counted"),
		duplicates:           events.WithLabelValues("duplicate"),
		rejected:             events.WithLabelValues("rejected"),
		invalid:              events.WithLabelValues("invalid"),
		held:                 events.WithLabelValues("held"),
		released:             events.WithLabelValues("released"),
		tooFarAhead:          events.WithLabelValues("too_far_ahead"),
		heldNow:              prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_aggregator_held_events", Help: "Events held in memory, uncounted, for being stamped more than max_event_future ahead."}),
		wrongSchema:          events.WithLabelValues("wrong_schema"),
		rerouted:             events.WithLabelValues("rerouted"),
		late:                 prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_late_events_total", Help: "Events that arrived after their hour had closed; counted in their own period."}),
		signals:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_aggregator_signals_total", Help: "Signals produced, by kind (replays re-produce the same ids)."}, []string{"kind"}),
		lag:                  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_aggregator_consumer_lag", Help: "High watermark minus the next offset to process, per partition."}, []string{"partition"}),
		series:               prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_aggregator_state_series", Help: "Tenant x model series held in memory."}),
		ids:                  prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_aggregator_state_ids", Help: "Event ids remembered for dedup and settlement."}),
		writeRows:            prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_write_batch_rows", Help: "Rows per partition flush to ClickHouse.", Buckets: prometheus.ExponentialBuckets(10, 4, 9)}),
		writeSeconds:         prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_write_seconds", Help: "Latency of a partition flush to ClickHouse, retries included.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		rebuildSeconds:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_rebuild_seconds", Help: "Time to rebuild a newly assigned partition from ClickHouse.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		writeErrors:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_aggregator_flush_errors_total", Help: "Failed flush steps (each is retried), by step."}, []string{"step"}),
		commitErrors:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_commit_errors_total", Help: "Offset commits refused (the events are re-read by the next owner)."}),
		snapshots:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_aggregator_snapshots_total", Help: "Partition state snapshots by result: stored in ClickHouse, failed to store, or skipped (state not snapshottable at that flush)."}, []string{"result"}),
		snapshotFallbacks:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_aggregator_snapshot_fallbacks_total", Help: "Partitions rebuilt in full instead of from a snapshot, by reason: none stored, mismatch (format or policy), corrupt, repartitioned (the topic gained partitions), error (ClickHouse)."}, []string{"reason"}),
		snapshotSeconds:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_snapshot_seconds", Help: "Time to encode a partition's state snapshot from its copy, off the poll loop: the partition is fetched meanwhile.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		snapshotCopy:         prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_snapshot_copy_seconds", Help: "Time to copy a partition's state for its snapshot, off the poll loop: the partition (only it) is not fetched meanwhile.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		snapshotPause:        prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_snapshot_pause_seconds", Help: "Time the poll loop (every partition of the instance) spends starting a partition's snapshot.", Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12)}),
		snapshotsDropped:     prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_snapshots_dropped_total", Help: "Superseded partition snapshots deleted from ClickHouse once a newer one was stored and its offset committed."}),
		rebuildEvents:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_rebuild_events_total", Help: "Distinct events replayed from ClickHouse to rebuild state."}),
		evictions:            prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_evicted_series_total", Help: "Tenant x model series dropped from memory because their tenant was idle (in event time) for idle_evict_after."}),
		adminInvalid:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_admin_invalid_total", Help: "Admin topic records that did not decode or validate; their action is not applied to tiers."}),
		adminRefused:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_admin_unauthenticated_total", Help: "Admin topic records refused because they are unsigned or badly signed (signal_auth); their action is not applied to tiers."}),
		adminUnsigned:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_admin_unsigned_total", Help: "Unsigned admin records applied under signal_auth.accept_unsigned_state (a migration)."}),
		restoreAnnouncements: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_restore_announcements_total", Help: "Signals emitted after a restore because the restored quota state differed from what quota_state says was announced (a limit lowered or an override expired while no aggregator ran)."}),
		adminReplayed:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_admin_replayed_total", Help: "Admin topic records refused because their version is older than their scope's (a replay of a superseded action); their action is not applied to tiers."}),
		reevaluations:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_policy_reevaluations_total", Help: "Policy reloads and operator overrides applied to every tenant in memory at once (tiers, signals, quota_state)."}),
		restores:             prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_restored_tenants_total", Help: "Tenants rebuilt from ClickHouse before their event was counted: evicted tenants that sent again, and tenants whose home partition moved when the topic gained partitions."}),
		restoreSeconds:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_aggregator_restore_seconds", Help: "Time to rebuild a returning evicted tenant from ClickHouse, retries included.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		unwritten:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_aggregator_unwritten_rows", Help: "Rows whose signals are published but which ClickHouse has not stored yet (their offsets are not committed)."}),
		fetchPauses:          prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_fetch_pauses_total", Help: "Times fetching paused because max_unwritten_rows rows waited for ClickHouse."}),
		handoverWaits:        prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_aggregator_handover_wait_seconds", Help: "How long a partition waited at a moved tenant's first event for the tenant's old home to commit under the new partition count, by result: handed_over, or timeout (restored from what ClickHouse held; see docs/scaling.md).", Buckets: prometheus.ExponentialBuckets(0.1, 2, 12)}, []string{"result"}),
		modelsCapped:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_models_capped_total", Help: "Events counted under model \"other\" because their tenant already counts max_models models on their own (policy max_models); no tenant label on purpose, the aggregator logs each such tenant once."}),
		flushesCut:           prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_aggregator_flushes_cut_short_total", Help: "Flushes whose signals and re-routed records could not be published before their deadline (a stop, a revoke past shutdown_timeout, a partition-count refresh): their batches are kept and published by the next flush, and nothing past them is committed meanwhile."}),
	}
	reloadFailures := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_aggregator_policy_reload_failures_total", Help: "Policy reloads rejected; the previous policy stays in force."}, func() float64 { return float64(w.Failures.Load()) })
	for _, c := range []prometheus.Collector{events, m.late, m.signals, m.lag, m.series, m.ids, m.writeRows, m.writeSeconds, m.rebuildSeconds, m.writeErrors, m.commitErrors, m.rebuildEvents, m.evictions, m.restores, m.restoreSeconds, m.heldNow, m.reevaluations, m.adminInvalid, m.adminRefused, m.adminUnsigned, m.adminReplayed, m.restoreAnnouncements, m.unwritten, m.fetchPauses, m.modelsCapped, m.handoverWaits, m.snapshots, m.snapshotFallbacks, m.snapshotSeconds, m.snapshotCopy, m.snapshotPause, m.snapshotsDropped, m.flushesCut, reloadFailures, controlplane.PolicyConflicts("aggregator", w)} {
		// A second aggregator in one process (tests) shares the registry.
		_ = reg.Register(c)
	}
	return m
}

// RegisterMetrics registers the aggregator's collectors on reg as Run
// does, unconnected (they read zero): for what lists the series a Sluice
// process exports, such as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) {
	newMetrics(reg, policy.Static(nil))
}
