package admission

import (
	"testing"
	"time"
)

// TestLostReplyOfACorrectionIsAppliedOnce: Redis applies a batch of
// corrections (here the rest of a lease, returned on Close) but its reply
// comes after the bound; the retry must not apply it a second time, which
// would refund the rest twice and let the window forget usage it really
// had.
func TestLostReplyOfACorrectionIsAppliedOnce(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	faults := newScriptFaults(AdjustScript)
	c.AddHook(faults)
	// A day's window has granules of 24 minutes: the lease and the
	// admissions share one, so a second refund of the rest would show
	// rather than stop at an empty granule.
	busy := Rule{Name: "platform-tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: 24 * time.Hour}
	l, err := New(c, &Rules{Shared: []Rule{busy}}, WithPrefix(prefix), WithMaxWait(2*time.Second), WithLeaseTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var admitted int64
	for range 3000 {
		if !mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: 8, CompletionTokens: 2}).Decision.Allowed {
			t.Fatal("refused")
		}
		admitted += 10
	}
	key := sharedKey(prefix, busy, Scope{})
	if got := windowUsed(t, c, key); got <= admitted {
		t.Fatalf("Redis holds %d for %d admitted: no lease outstanding to return", got, admitted)
	}
	t.Logf("before close: %d in Redis, %d admitted", windowUsed(t, c, key), admitted)
	faults.arm(loseReply, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("after close: %d in Redis; %d calls %d faults", windowUsed(t, c, key), faults.calls.Load(), faults.faults.Load())
	if faults.faults.Load() != 1 || faults.calls.Load() < 2 {
		t.Fatalf("adjust.lua ran %d times with %d replies lost, want a lost reply and a retry", faults.calls.Load(), faults.faults.Load())
	}
	if got := windowUsed(t, c, key); got != admitted {
		t.Fatalf("Redis holds %d after the lease rest came back, want the %d admitted (the rest refunded %s)", got, admitted,
			map[bool]string{true: "twice", false: "not at all"}[got < admitted])
	}
}
