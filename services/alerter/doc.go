// Package alerter is the Sluice service that turns quota signals into
// notifications: it consumes sluice.signals.v1, keeps one alert per tenant ×
// model × period × rule in its engine (pending → firing → resolved), and
// delivers to Alertmanager (v2 API) and to direct channels of the kinds
// registered in kinds.go (DingTalk robots, Feishu bots, WeCom robots, Slack
// webhooks, and signed JSON webhooks for customers' own systems, described
// in docs/webhooks.md), routed per tenant by the quota policy's channels
// plus the operator channels of its own configuration. README.md describes
// the layout and how to add a channel kind.
//
// # Rules
//
// Signals map to rules:
//
//   - tier_crossed, quota_exhausted → quota_tier (alertname SluiceQuotaTier): one alert
//     per quota carrying the highest tier that held for pending_for; severity
//     info below 90, warning from 90, critical from 100. A higher tier
//     escalates it (Alertmanager sees the old label set resolved and the new
//     one firing); a lower tier never re-notifies, so a tenant oscillating
//     around a threshold hears once. Tier 0, a period_reset or the end of
//     the period clears it.
//   - exhaustion_predicted → exhaustion_predicted
//     (alertname SluiceQuotaExhaustionPredicted): warning when the predicted time lies
//     within rules.exhaustion_warning of the signal, critical within
//     rules.exhaustion_critical; a prediction beyond the horizon, one the
//     aggregator withdraws (attribute state=clear: no longer predicted
//     within its horizon), a quota_exhausted or a period_reset clears it,
//     and so does a predicted time that passed rules.exhaustion_critical
//     ago without the quota running out or a newer prediction (a tenant
//     that stopped sending). The annotations carry the prediction's
//     uncertainty (predicted_earliest, predicted_latest, prediction_basis).
//   - rate_exceeded → rate_exceeded (alertname SluiceRateExceeded), warning; a
//     rate_exceeded with used under limit clears it.
//   - anomaly with attribute breaker=<kind> → breaker_open
//     (alertname SluiceBreakerOpen), critical, variant = the kind; other anomalies →
//     anomaly (alertname SluiceAnomaly), warning, variant = attribute type (rate_spike,
//     error_ratio, slow_call …). Attribute state=resolved|closed|clear|ok
//     clears either.
//   - reconciliation_drift → reconciliation_drift
//     (alertname SluiceReconciliationDrift), warning.
//
// The last three have no guaranteed "clear" signal, so they also resolve
// when no signal refreshed them for rules.auto_resolve_after. late_event
// signals are not alerted on.
//
// # Against fatigue
//
// A condition must hold rules.pending_for before it is notified and stay
// clear rules.resolve_after before the resolved notice; signals are
// deduplicated by ID; per-tenant silences and quiet hours (alerter.tenants,
// since the policy has no such fields) hold firing notices back until they
// end; and notices for direct channels wait rules.group_wait so that more
// than rules.group_threshold alerts of one rule, severity and status become
// one incident message per channel. Alertmanager gets every alert (it
// groups by itself), batched per tick into one request.
//
// # State
//
// The engine's state per alert (condition level, pending and clear times,
// and what was last notified) and the notifications held for grouping are
// kept on a compacted topic, services.alerter.state_topic
// (sluice.alerter.state.v1 for the default group), one record per alert key
// and per channel with held notifications, co-partitioned with the signals
// topic.
// Every tick writes the states that changed, then commits the offsets of
// the signals applied before them, then releases the tick's notifications
// to the channels; a replica assigned a signals partition loads that
// partition's states before it consumes a signal from it. So a restart,
// crash or rebalance resumes with the state the committed offsets left:
// a firing alert is not announced again, and one whose condition ended
// while the alerter was down resolves once. README.md lists what a crash
// can still cost.
package alerter
