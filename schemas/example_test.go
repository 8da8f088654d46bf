package schemas_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

func ExampleSignalID() {
	periodStart := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	s := schemas.Signal{
		ID:   schemas.SignalID(string(schemas.SignalTierCrossed), "acme", "*", "monthly_tokens", periodStart.Format(time.RFC3339), "90"),
		Kind: schemas.SignalTierCrossed, Time: time.Date(2024, 5, 20, 8, 15, 0, 0, time.UTC),
		Tenant: "acme", Model: "*", Quota: schemas.QuotaMonthlyTokens, Tier: 90, PreviousTier: 70,
		Direction: schemas.DirectionUp, Used: 9.05e7, Limit: 1e8, Unit: schemas.UnitTokens,
	}
	b, err := schemas.EncodeSignal(&s)
	fmt.Println(len(s.ID), err)
	fmt.Println(string(b) != "")
	// Output:
	// 32 <nil>
	// true
}
