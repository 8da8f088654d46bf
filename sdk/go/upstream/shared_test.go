package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/priority"
)

// TestGuardsShareAnUpstreamThroughRedis: two gateways' Guards share one
// upstream's limit of 1 in the real Redis. While gateway A holds the slot,
// gateway B's request waits in B's queue; when A releases, B's queue
// (polling the shared count) admits it.
func TestGuardsShareAnUpstreamThroughRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rdb, prefix := itest.ScratchRedis(t)
	guard := func(id string) *Guard {
		s, err := concurrency.NewShared(rdb, prefix, "acct", id, concurrency.Fixed(1))
		if err != nil {
			t.Fatal(err)
		}
		return newGuard(t, SharedGate(s))
	}
	a, b := guard("gw-a"), guard("gw-b")
	ctx := context.Background()
	pa, d := a.Acquire(ctx, Request{Tenant: "t1", Priority: schemas.PriorityNormal})
	if !d.Admitted() {
		t.Fatalf("a: %+v", d)
	}
	got := make(chan priority.Decision, 1)
	go func() {
		pb, d := b.Acquire(ctx, Request{Tenant: "t2", Priority: schemas.PriorityHigh, Deadline: time.Now().Add(within)})
		pb.Release(concurrency.Success)
		got <- d
	}()
	itest.Eventually(t, within, "b's request waiting", func() bool { return b.Stats().Queue.Waiting[schemas.PriorityHigh.Index()] == 1 })
	pa.Release(concurrency.Success)
	if d := <-got; !d.Admitted() || d.Waited <= 0 {
		t.Fatalf("b after a released: %+v", d)
	}
}
