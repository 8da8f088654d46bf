// Package eventjson decodes and encodes usage event v1 as JSON: the plain
// object ([DecodeUsageEvent], [AppendUsageEventJSON]), the structured-mode
// CloudEvent that carries it ([DecodeCloudEvent], [AppendCloudEventJSON]),
// and the events of a whole request body at once ([BatchDecoder]). What an
// event is, and every rule it must follow, is package schemas; this package
// only turns bytes into events and back, reporting problems with the
// messages schemas writes.
//
// # Why it is hand-written
//
// Every usage event passes through this decoder twice, at ingest and again
// in the aggregator, so it is the hot path of the pipeline. On a typical
// event it takes about a microsecond and one allocation (the copy of the
// input that the event's strings share), validation included; encoding/json
// followed by Validate takes about ten times as long with ten allocations,
// and is too lenient besides (it matches keys regardless of case and lets
// the last of two duplicate keys win). The scanner reads strings eight
// bytes at a time, parses numbers and timestamps without allocating, and
// checks the fields it can while their bytes are at hand so that validation
// does not walk them again.
//
// BenchmarkDecodeValidate guards it (target at most 1 µs and 2 allocations
// per event), next to BenchmarkDecodeValidateEncodingJSON, the reference it
// must stay well ahead of; TestDecodeAllocations fails a change that
// allocates more. `make bench` runs them with every other benchmark and
// reports the ingest path's figure as ingest_decode_validate_ns and
// ingest_decode_validate_allocs (BenchmarkDecodeValidate in
// services/ingest). Run them before and after any change here:
//
//	go test -run '^$' -bench . -benchmem ./schemas/eventjson/
//
// A fuzz target per decoder, and tests that hold the decoders and the JSON
// Schemas of package schemas to the same verdicts, keep the speed honest.
//
// The encoder is hand-written for the same reason, and to be canonical:
// equal events encode to equal bytes, which Kafka compaction and byte-level
// deduplication rely on.
package eventjson
