// Package metricset registers a component's Prometheus collectors as one
// group: all of them or none, so that a component that fails to start (a
// name taken on the registerer) leaves nothing behind, and one that stops
// can take all of them off again. The SDK's Emitter and sluice gateway use
// it.
package metricset

import "github.com/prometheus/client_golang/prometheus"

// Set is a group of collectors registered together.
type Set []prometheus.Collector

// Register registers every collector of s on r, or none: on the first
// refusal it unregisters those it registered and returns the refusal.
func (s Set) Register(r prometheus.Registerer) error {
	for i, c := range s {
		if err := r.Register(c); err != nil {
			for _, done := range s[:i] {
				r.Unregister(done)
			}
			return err
		}
	}
	return nil
}

// Unregister takes every collector of s off r.
func (s Set) Unregister(r prometheus.Registerer) {
	for _, c := range s {
		r.Unregister(c)
	}
}
