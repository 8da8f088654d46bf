package metricset

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A refused collector leaves none of the set registered, and Unregister
// frees every name again.
func TestRegisterAllOrNone(t *testing.T) {
	r := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	taken := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	if err := r.Register(taken); err != nil {
		t.Fatal(err)
	}
	s := Set{a, prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})}
	if err := s.Register(r); err == nil {
		t.Fatal("a set with a taken name registered")
	}
	if err := r.Register(a); err != nil {
		t.Fatalf("the refused set left a_total registered: %v", err)
	}
	r.Unregister(a)
	r.Unregister(taken)
	if err := s.Register(r); err != nil {
		t.Fatal(err)
	}
	s.Unregister(r)
	if err := s.Register(r); err != nil {
		t.Fatalf("Unregister left a name taken: %v", err)
	}
}
