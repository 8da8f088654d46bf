// Package priority orders the requests a gateway sends to one upstream
// when that upstream is saturated: critical first, low last.
//
// Class is one of the four priority classes (critical, high, normal,
// low); Effective is the rule that gives a request its class: the
// tenant's policy class, optionally moved by the X-Sluice-Priority header
// when the caller's API key may.
package priority
