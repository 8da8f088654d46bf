// Package schemas defines the data contracts of Sluice: the usage event
// that gateways send, the signal that the aggregator emits, the Kafka topics
// and headers that carry them, their validation rules and limits, and JSON
// Schemas stating the same rules for other languages.
//
// Every Sluice component imports this package to agree on what an event is,
// so the rules live here once: ingest rejects with the messages written
// here, the aggregator trusts what passed them, and a gateway SDK can run
// the same checks before it sends. How events travel as bytes lives in two
// packages beneath, so that this one reads as the contract:
//
//   - schemas/eventjson decodes and encodes usage events as JSON and as
//     CloudEvents, by hand, because it is the hot path of ingest and the
//     aggregator.
//   - schemas/framing finds the events of a batch body (a JSON array or
//     NDJSON) without decoding them.
//
// Signals are fewer, and [EncodeSignal] (encoding/json) and [DecodeSignal]
// (a small hand-written walker, held to encoding/json's verdicts by the
// tests) live here.
//
// # Usage event v1
//
// A [UsageEvent] reports what one finished LLM request spent:
//
//	{
//	  "id": "01HZX3Q8J5W1K8S9V2M4N6P7R0",
//	  "time": "2024-05-01T12:00:00.250Z",
//	  "tenant": "acme",
//	  "model": "gpt-4o",
//	  "prompt_tokens": 1200,
//	  "completion_tokens": 350,
//	  "api_key_id": "key_7f3a",
//	  "status": 200,
//	  "outcome": "ok",
//	  "latency_ms": 1840
//	}
//
// id, time, tenant, model, prompt_tokens and completion_tokens are required.
// [UsageEvent.Validate] lists every rule and the Max* constants name the
// limits. The decoders are strict: an unknown field, a value of the wrong
// type, a fractional or oversized number and a duplicate key are errors that
// name the field, never silently dropped or coerced, because a mistake
// caught at ingest is a bug report and one caught on an invoice is a
// dispute. Custom data goes in attributes.
//
// All problems of an event are reported together as a [ValidationError], a
// list of [FieldError] values whose Field is a JSON path ("prompt_tokens",
// "attributes.team", "data.tenant"). Input that is not JSON at all is a
// [*SyntaxError] with a byte offset.
//
// Time windows ("no more than 5 minutes in the future") are not a property
// of the event but of the deployment: ingest applies them with [CheckTime].
//
// # Decoders
//
// A decoder outside this package reports each problem once with the help of
// [EventField], [RequiredEventFields], [UsageEvent.ValidateFields],
// [ValidationError.Add] and [AttributeValid]: it reports what it finds while
// reading (a wrong type, a duplicate key, a missing field), then lets
// validation check the rest.
//
// # CloudEvents
//
// Gateways that speak CloudEvents 1.0 send the same payload in data, in
// structured mode ([ContentTypeCloudEvents]) or as a batch
// ([ContentTypeCloudEventsBatch], a JSON array of structured events) with
// type [CloudEventTypeUsageV1]. The envelope's id and time are the event's,
// subject is the tenant; eventjson.DecodeCloudEvent documents the mapping
// and [JSONSchemaCloudEventUsageV1] states it. Extension attributes are
// ignored, as the CloudEvents spec asks.
//
// # Signals v1
//
// A [Signal] is a change of a tenant's quota state — a tier crossed, an
// exhaustion predicted, a quota exhausted, a period reset, a rate exceeded,
// an anomaly, a late event, reconciliation drift — emitted by the aggregator
// on change only and computed from event time and offsets, never from the
// wall clock. [SignalID] derives its ID from what identifies the change, so
// a replay produces identical signals that consumers deduplicate.
// [EncodeSignal] refuses invalid signals; [DecodeSignal] ignores unknown
// fields so that consumers survive additive changes.
//
// # Versioning
//
// The topic name carries the major version: [TopicUsageV1]
// ("sluice.usage.v1") and [TopicSignalsV1] ("sluice.signals.v1"), and every
// record also names its schema in the Kafka header [HeaderSchema]
// ("schema"), so that a consumer reading two topics knows what it holds.
// Records may also carry the W3C trace context headers traceparent and
// tracestate (sdk/go/traceprop, docs/tracing.md): optional, advisory and
// unsigned, they never change how a record is counted or enforced.
//
// Additive changes keep v1: a new optional field, a raised limit, a new
// signal kind. Producers may send the new field only after the consumers
// that must understand it have been deployed; usage events are decoded
// strictly, so ingest is upgraded before gateways send a new field. A
// consumer that meets a signal kind it does not know logs and skips it.
//
// Anything else is breaking: removing or renaming a field, changing its
// type or meaning, making an optional field required, lowering a limit. A
// breaking change gets a new Go type (UsageEventV2), new JSON Schemas
// (usage-event.v2.json) and a new topic ("sluice.usage.v2"). During a
// migration window producers dual-write every event to both topics with the
// same id; consumers subscribe to both and deduplicate by id, which they do
// anyway for retries. When no consumer reads v1 any more, producers stop
// writing it and the v1 topic expires. v1 types stay in this package for as
// long as v1 data exists.
//
// # JSON Schemas
//
// [JSONSchemaFS] ships usage-event.v1.json, signal.v1.json and
// cloudevent-usage.v1.json (draft 2020-12), and [JSONSchema] returns one by
// name; alert-webhook.v1.json beside them describes what the alerter's
// webhook channel kind sends, and the webhook package's tests hold its
// payloads to it. They express the same rules as the Go code, including patterns,
// bounds, enums, required fields and date-time formats, and a test holds
// both to the same verdicts on a corpus of documents. What JSON Schema
// cannot say is checked only in Go, and each schema's description lists it:
// comparisons between fields (cached_tokens + cache_write_tokens <= prompt_tokens, data.id equal
// to the envelope's id), lengths in bytes (JSON Schema counts characters;
// they agree for ASCII), duplicate keys and invalid Unicode.
package schemas
