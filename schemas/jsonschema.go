package schemas

import (
	"embed"
	"io/fs"
)

// JSONSchemaFS holds the JSON Schemas (draft 2020-12) of the formats this
// package defines, under jsonschema/: for gateways written in other
// languages, for ingest to serve, and for documentation. They state the same
// rules as the Go validation except where JSON Schema cannot (see each
// schema's description); a test checks that both agree on a corpus of good
// and bad documents. Their $id values are stable names, not download
// locations, and the schemas refer to each other by them.
//
//go:embed jsonschema/*.json
var JSONSchemaFS embed.FS

// Names of the schemas in JSONSchemaFS, for [JSONSchema].
const (
	// JSONSchemaUsageEventV1 describes a [UsageEvent] as
	// eventjson.DecodeUsageEvent accepts it.
	JSONSchemaUsageEventV1 = "usage-event.v1.json"
	// JSONSchemaSignalV1 describes a [Signal] as [DecodeSignal] accepts it.
	JSONSchemaSignalV1 = "signal.v1.json"
	// JSONSchemaCloudEventUsageV1 describes a usage event in a structured
	// CloudEvent as eventjson.DecodeCloudEvent accepts it. It refers to
	// JSONSchemaUsageEventV1, so a validator needs both.
	JSONSchemaCloudEventUsageV1 = "cloudevent-usage.v1.json"
	// JSONSchemaAlertWebhookV1 describes the body the alerter's webhook
	// channel kind POSTs (package services/alerter/webhook, whose tests
	// hold its payloads to it; docs/webhooks.md). It stands alone, so a
	// receiver needs only this file.
	JSONSchemaAlertWebhookV1 = "alert-webhook.v1.json"
)

// JSONSchema returns the schema document with the given name, one of the
// JSONSchema* constants. The error wraps fs.ErrNotExist for other names.
func JSONSchema(name string) ([]byte, error) {
	return fs.ReadFile(JSONSchemaFS, "jsonschema/"+name)
}
