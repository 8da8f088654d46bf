// Package e2e holds Sluice's end-to-end, fault and bad-input suites and the
// end-to-end enforcement-lag benchmark. Everything here is test code: the
// suites build the sluice binary once, run each service as its own
// subprocess against the real Kafka, ClickHouse, Redis and Alertmanager,
// and drive them through the reference gateway and the ingest API, so a
// kill -9 is a real crash and every assertion is about what a user sees.
// See README.md for what each suite proves and the recovery bounds.
package e2e
