// Package sidebyside is the method of the benchmarks that measure Sluice's
// admission beside a rate-limit service a user might run instead
// (bench/peers/<peer>, modules of their own): the rules both sides are
// given, the closed-loop load generator, the CPU accounting of the deciding
// side, the overshoot as the load generator counts it, and the figures each
// side reports. It is one package so that every peer is measured the same
// way: a change to how overshoot or CPU is counted reaches every comparison
// at once. Its figures and their keys are described in bench/README.md
// ("Admission against gubernator", "Admission against the Envoy ratelimit
// service").
//
// It lives in Sluice's module, which every peer module already requires
// through a replace of the checkout, so that it needs no go.mod of its
// own, and `make test` runs its tests.
package sidebyside
