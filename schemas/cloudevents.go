package schemas

// CloudEvents constants. Sluice accepts usage events as CloudEvents 1.0 in
// the JSON event format, structured mode: one event as
// ContentTypeCloudEvents, or a JSON array of them as
// ContentTypeCloudEventsBatch. The JSON Schema
// [JSONSchemaCloudEventUsageV1] states the mapping; package
// schemas/eventjson decodes and encodes it.
const (
	// CloudEventTypeUsageV1 is the CloudEvents "type" of a usage event v1.
	CloudEventTypeUsageV1 = "dev.sluice.usage.v1"

	// CloudEventsSpecVersion is the only CloudEvents "specversion" accepted.
	CloudEventsSpecVersion = "1.0"

	// ContentTypeCloudEvents is the media type of one structured-mode
	// CloudEvent.
	ContentTypeCloudEvents = "application/cloudevents+json"

	// ContentTypeCloudEventsBatch is the media type of a JSON array of
	// structured-mode CloudEvents.
	ContentTypeCloudEventsBatch = "application/cloudevents-batch+json"
)
