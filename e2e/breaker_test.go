package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// heldUpstream answers every call 500; while hold is set, only once
// release is closed, so that a test knows how many calls a gateway let
// through before any of them settles.
type heldUpstream struct {
	hold    atomic.Bool
	held    atomic.Int64 // calls that waited (or wait) for release
	release chan struct{}
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if u.hold.Load() {
		u.held.Add(1)
		select {
		case <-u.release:
		case <-r.Context().Done():
		}
	}
	http.Error(w, `{"error":{"message":"upstream down","type":"server_error"}}`, http.StatusInternalServerError)
}

// TestFailedProbesFromTwoGatewaysReopenWithDoubledOpenTime: a tenant's
// error-ratio breaker (min_requests 20, 5 probes per Checker) opens on
// failing calls; once half-open, two gateways — two Checkers — send their
// 5 probes each, 10 calls in all, half of min_requests, and every one
// fails. The breaker reopens with twice its open time. (Judged by the
// min_requests window instead, those 10 calls reached no verdict and the
// window's "resolved" closed the breaker onto the failing upstream.)
func TestFailedProbesFromTwoGatewaysReopenWithDoubledOpenTime(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end suite: needs the real services")
	}
	t.Parallel()
	tenant := "e2e-probes-" + randomKey()[7:15]
	const model = "gpt-4o-mini"
	const openFor = 5 * time.Second
	pol := policyYAML(map[string]int{tenant: 1_000_000_000}) + fmt.Sprintf(
		"    breakers:\n      error_ratio: {threshold: 0.5, min_requests: 20, window: 1m, open_for: %v, max_open_for: 1m, half_open_probes: 5}\n", openFor)
	s := newStack(t, stackOptions{Policy: pol})
	s.startAll("ingest", "aggregator", "enforcer")
	ups := [2]*heldUpstream{{release: make(chan struct{})}, {release: make(chan struct{})}}
	gws := [2]*referenceGateway{newGatewayTo(t, s, ups[0], tenant), newGatewayTo(t, s, ups[1], tenant)}
	var calls sync.WaitGroup
	t.Cleanup(func() {
		for _, u := range ups {
			select {
			case <-u.release:
			default:
				close(u.release)
			}
		}
		calls.Wait()
	})
	admin, err := adminapi.NewClient("http://"+s.adminAddr, s.adminToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	breaker := func() (adminapi.Breaker, error) {
		bs, err := admin.Breakers(context.Background(), tenant)
		if err != nil {
			return adminapi.Breaker{}, err
		}
		for _, b := range bs {
			if b.Kind == flags.KindErrorRatio && b.Scope == model {
				return b, nil
			}
		}
		return adminapi.Breaker{}, fmt.Errorf("no error-ratio breaker on %s among %+v", model, bs)
	}

	// 40 failing calls through gateway A: at least 20 in one minute's
	// window, whichever way the minutes fall. On a slow machine the
	// emitter's own sends can open the breaker before the 40th: a 503
	// is then the breaker's answer, which is fine once 20 calls failed.
	for i := range 40 {
		a := gws[0].chat(t, tenant, model, 10)
		if a.status == http.StatusServiceUnavailable && i >= 20 {
			break
		}
		if a.status != http.StatusInternalServerError {
			t.Fatalf("call %d before the breaker: status %d, want the upstream's 500", i+1, a.status)
		}
	}
	gws[0].flush(t)
	itest.EventuallyNoError(t, waitTimeout, "the breaker opened", func() error {
		b, err := breaker()
		if err == nil && (b.State != flags.StateOpen || b.Until.Sub(b.OpenedAt) != openFor) {
			err = fmt.Errorf("breaker %+v, want open for %v", b, openFor)
		}
		return err
	})

	// Both Checkers must know of the open breaker before the probe phase:
	// a call that one of them still lets through as an ordinary call
	// would be held as if it were a probe, and, carrying no probe mark,
	// would never settle the half-open round (seen on a loaded machine:
	// the round expired and the breaker closed). An open breaker's Check
	// uses up no probe.
	itest.EventuallyNoError(t, waitTimeout, "both gateways' Checkers refuse the open breaker", func() error {
		for i, g := range gws {
			if d := g.checker.Check(tenant, model, ""); d.Outcome != checker.Refused {
				return fmt.Errorf("gateway %d's Checker: outcome %d, want refused", i, d.Outcome)
			}
		}
		return nil
	})

	// Half-open: each gateway lets 5 probes through, held in its upstream;
	// its Checker refuses the rest.
	ups[0].hold.Store(true)
	ups[1].hold.Store(true)
	var mu sync.Mutex
	var statuses []int
	itest.EventuallyNoError(t, waitTimeout, "5 probes in flight from each gateway", func() error {
		for i, g := range gws {
			if ups[i].held.Load() >= 5 {
				continue
			}
			calls.Add(1)
			go func() {
				defer calls.Done()
				st, err := g.chatStatus(tenant, model)
				if err != nil {
					t.Errorf("gateway %d: %v", i, err)
				}
				mu.Lock()
				statuses = append(statuses, st)
				mu.Unlock()
			}()
		}
		if a, b := ups[0].held.Load(), ups[1].held.Load(); a != 5 || b != 5 {
			return fmt.Errorf("in flight: %d probes from gateway A, %d from B", a, b)
		}
		return nil
	})
	if b, err := breaker(); err != nil || b.State != flags.StateHalfOpen || b.Probes != 5 {
		t.Fatalf("breaker %+v (%v), want half-open with 5 probes per Checker", b, err)
	}
	for _, u := range ups {
		close(u.release)
	}
	calls.Wait()
	mu.Lock()
	for _, st := range statuses {
		if st != http.StatusInternalServerError && st != http.StatusServiceUnavailable {
			t.Fatalf("a gateway answered %d: want the upstream's 500 to probes, 503 to the refused", st)
		}
	}
	mu.Unlock()
	if a, b := ups[0].held.Load(), ups[1].held.Load(); a != 5 || b != 5 {
		t.Fatalf("%d and %d probes reached the upstreams, want 5 from each Checker", a, b)
	}
	for _, g := range gws {
		g.flush(t)
	}

	itest.EventuallyNoError(t, waitTimeout, "the failed probes reopened the breaker", func() error {
		b, err := breaker()
		switch {
		case err != nil:
			return err
		case b.Failures == 0:
			return fmt.Errorf("breaker %+v: no failed round yet", b)
		case b.Failures != 1 || b.State != flags.StateOpen || b.Until.Sub(b.OpenedAt) != 2*openFor || !strings.Contains(b.Reason, "probe failed"):
			t.Fatalf("breaker after the failed probes %+v, want open for %v because a probe failed", b, 2*openFor)
		}
		return nil
	})
}
