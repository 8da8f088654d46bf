package eventjson_test

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/schemas/eventjson"
	"github.com/sluicehq/sluice/schemas/framing"
)

func ExampleDecodeUsageEvent() {
	body := []byte(`{"id":"evt-1","time":"2024-05-01T14:00:00+02:00","tenant":"acme","model":"gpt-4o",
		"prompt_tokens":1200,"completion_tokens":350,"outcome":"ok"}`)
	var ev schemas.UsageEvent
	if err := eventjson.DecodeUsageEvent(body, &ev); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ev.Tenant, ev.Model, ev.TotalTokens(), ev.Time)
	fmt.Printf("%s\n", eventjson.AppendUsageEventJSON(nil, &ev))
	// Output:
	// acme gpt-4o 1550 2024-05-01 12:00:00 +0000 UTC
	// {"id":"evt-1","time":"2024-05-01T12:00:00Z","tenant":"acme","model":"gpt-4o","prompt_tokens":1200,"completion_tokens":350,"outcome":"ok"}
}

func Example_validationError() {
	body := []byte(`{"id":"evt-1","time":"2024-05-01T12:00:00Z","tenant":"acme corp","model":"gpt-4o",
		"prompt_tokens":"1200","completion_tokens":350,"colour":"blue"}`)
	var ev schemas.UsageEvent
	var ve schemas.ValidationError
	if err := eventjson.DecodeUsageEvent(body, &ev); errors.As(err, &ve) {
		for _, fe := range ve {
			fmt.Printf("%s: %s\n", fe.Field, fe.Reason)
		}
	}
	// Output:
	// prompt_tokens: must be an integer, not a string
	// colour: is not a field of usage event v1; put custom labels in attributes
	// tenant: has byte 0x20 at offset 4; use only letters, digits and . _ : -
}

func Example_batch() {
	batch := []byte(`[
		{"id":"a","time":"2024-05-01T12:00:00Z","tenant":"acme","model":"m","prompt_tokens":1,"completion_tokens":2},
		{"id":"b","time":"2024-05-01T12:00:00Z","tenant":"acme","model":"m","prompt_tokens":-1,"completion_tokens":2}
	]`)
	err := framing.SplitJSONArray(batch, func(i int, raw []byte) error {
		var ev schemas.UsageEvent
		if err := eventjson.DecodeUsageEvent(raw, &ev); err != nil {
			fmt.Printf("item %d rejected: %v\n", i, err)
			return nil // judge each item on its own
		}
		fmt.Printf("item %d accepted: %s\n", i, ev.ID)
		return nil
	})
	fmt.Println("framing:", err)
	// Output:
	// item 0 accepted: a
	// item 1 rejected: schemas: invalid field prompt_tokens: is -1; token counts cannot be negative
	// framing: <nil>
}

func ExampleDecodeCloudEvent() {
	body := []byte(`{"specversion":"1.0","type":"dev.sluice.usage.v1","source":"//gateway.example.com/eu-1",
		"id":"evt-9","time":"2024-05-01T12:00:00Z","subject":"acme","traceparent":"00-ab-cd-01",
		"data":{"tenant":"acme","model":"gpt-4o","prompt_tokens":10,"completion_tokens":5}}`)
	var ev schemas.UsageEvent
	err := eventjson.DecodeCloudEvent(body, &ev)
	fmt.Println(ev.ID, ev.Tenant, ev.TotalTokens(), err)
	// Output:
	// evt-9 acme 15 <nil>
}
