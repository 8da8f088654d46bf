package main

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// demoAdmissionWait is the demo gateway's admission.max_wait. The demo
// shares one machine with the whole pipeline (Kafka, ClickHouse, the
// services): a Redis answer late by a scheduling hiccup must not read as
// Redis being away. A gateway of its own keeps the 5 ms default.
const demoAdmissionWait = 50 * time.Millisecond

// admissionCounts counts per tenant what admission decided in the demo's
// `sluice gateway`, for the live view: it wraps the gateway's Admitter
// (gateway.WithAdmitterWrap), passing every request on and counting
// the answers (flag refusals never reach admission and are not counted).
type admissionCounts struct {
	next frontend.Admitter

	mu sync.Mutex
	m  map[string]*tenantAdmissions
}

type tenantAdmissions struct {
	admitted, refused int64
	rule              string // of the latest refusal
}

func newAdmissionCounts() *admissionCounts {
	return &admissionCounts{m: map[string]*tenantAdmissions{}}
}

// wrap makes c count what next decides; the gateway calls it once, with
// the admission it built from the policy.
func (c *admissionCounts) wrap(next frontend.Admitter) frontend.Admitter {
	c.next = next
	return c
}

// Admit implements frontend.Admitter.
func (c *admissionCounts) Admit(ctx context.Context, req frontend.AdmitRequest) frontend.Admission {
	a := c.next.Admit(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	ta := c.m[req.Tenant]
	if ta == nil {
		ta = &tenantAdmissions{}
		c.m[req.Tenant] = ta
	}
	if a.Refused == nil {
		ta.admitted++
		return a
	}
	ta.refused++
	if d, ok := a.Refused.Error.Sluice.(*admission.Detail); ok {
		ta.rule = d.Rule
	}
	return a
}

// of returns a tenant's counts.
func (c *admissionCounts) of(tenant string) (admitted, refused int64, rule string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ta := c.m[tenant]; ta != nil {
		return ta.admitted, ta.refused, ta.rule
	}
	return 0, 0, ""
}
