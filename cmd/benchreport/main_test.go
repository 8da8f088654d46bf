package main

import (
	"strings"
	"testing"
)

func TestParseKeepsOnlyKeyShapedMetrics(t *testing.T) {
	out := `goos: linux
BenchmarkCheck-2   	30000000	        12.5 ns/op	        12.5 checker_check_ns	       0 checker_check_allocs	       0 B/op	       0 allocs/op
BenchmarkIngest/batch1000-2   	      10	 4000000 ns/op	    250000 ingest_events_per_sec_batch1000
PASS`
	got, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"checker_check_ns": 12.5, "checker_check_allocs": 0, "ingest_events_per_sec_batch1000": 250000}
	if len(got) != len(want) {
		t.Fatalf("parse = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
