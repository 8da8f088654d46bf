package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseKeepsOnlyKeyShapedMetrics(t *testing.T) {
	out := `goos: linux
BenchmarkCheck-2   	30000000	        12.5 ns/op	        12.5 checker_check_ns	       0 checker_check_allocs	       0 B/op	       0 allocs/op
BenchmarkIngest/batch1000-2   	      10	 4000000 ns/op	    250000 ingest_events_per_sec_batch1000
PASS`
	got, _, err := parse(strings.NewReader(out))
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

func TestParseAttachesWindowsToFigures(t *testing.T) {
	out := `BenchmarkA
BenchmarkA-2   	10	 5 ns/op	 5 a_ns	 1 a_allocs
benchreport-window: {"package":"p","benchmark":"BenchmarkA-2","seconds":1,"other_cores":0.5,"steal_cores":0.1}
BenchmarkB/sub
some line the benchmark printed
BenchmarkB/sub-2   	10	 7 ns/op	 7 b_ns
benchreport-window: {"package":"p","benchmark":"BenchmarkB/sub-2","seconds":2}
PASS
benchreport-window: {"package":"p","seconds":3}`
	figures, windows, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(figures) != 3 || len(windows) != 3 {
		t.Fatalf("figures %v, windows %+v", figures, windows)
	}
	if got := windows[0].Figures; len(got) != 2 || got[0] != "a_ns" || got[1] != "a_allocs" || windows[0].OtherCores != 0.5 {
		t.Errorf("first window %+v", windows[0])
	}
	if got := windows[1].Figures; len(got) != 1 || got[0] != "b_ns" {
		t.Errorf("second window %+v", windows[1])
	}
	if windows[2].Benchmark != "" || windows[2].Figures != nil || windows[2].Seconds != 3 {
		t.Errorf("package window %+v", windows[2])
	}
}

func TestMergeReplacesOnlyTheRerunFigures(t *testing.T) {
	old := map[string]any{
		"a_ns": 1.0, "b_ns": 2.0, "c_ns": 3.0, "cores": 2.0, "commit": "old", "go_version": "go1",
		"conditions": []any{
			map[string]any{"package": "p", "benchmark": "BenchmarkAB-2", "figures": []any{"a_ns", "b_ns"}},
			map[string]any{"package": "q", "benchmark": "BenchmarkC-2", "figures": []any{"c_ns"}},
			map[string]any{"package": "p"},
			map[string]any{"package": "q"},
		},
	}
	figures, windows := merge(old, map[string]float64{"a_ns": 10}, []Window{
		{Package: "p", Benchmark: "BenchmarkA-2", Figures: []string{"a_ns"}}, {Package: "p"}})
	if len(figures) != 3 || figures["a_ns"] != 10 || figures["b_ns"] != 2 || figures["c_ns"] != 3 {
		t.Errorf("figures %v", figures)
	}
	var names []string
	for _, w := range windows {
		names = append(names, w.Package+":"+w.Benchmark+":"+strings.Join(w.Figures, ","))
	}
	want := "p:BenchmarkAB-2:b_ns q:BenchmarkC-2:c_ns q:: p:BenchmarkA-2:a_ns p::"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("windows\n got %s\nwant %s", got, want)
	}
}

func TestResultLinesAndNames(t *testing.T) {
	for line, want := range map[string]bool{
		"BenchmarkA-2 \t 10\t 5 ns/op": true, "BenchmarkA": false, "BenchmarkA-2 printed something else": false,
	} {
		if got := isResultLine(strings.Fields(line)); got != want {
			t.Errorf("isResultLine(%q) = %v", line, got)
		}
	}
	for in, want := range map[string]string{
		"BenchmarkA-2": "BenchmarkA", "BenchmarkB/size-100-16": "BenchmarkB/size-100", "BenchmarkC": "BenchmarkC",
		"BenchmarkD-": "BenchmarkD-", "BenchmarkE-x": "BenchmarkE-x",
	} {
		if got := trimProcs(in); got != want {
			t.Errorf("trimProcs(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	start := machineSample{at: t0, busy: 10 * time.Second, steal: time.Second, ours: 0, running: 3}
	mid := machineSample{at: t0.Add(time.Second), running: 9}
	end := machineSample{at: t0.Add(2 * time.Second), busy: 13 * time.Second, steal: 1200 * time.Millisecond, ours: 2 * time.Second, running: 3, load1: 1.5}
	w := window("p", "BenchmarkA-2", start, end, []machineSample{mid})
	if w.Seconds != 2 || w.BusyCores != 1.5 || w.OursCores != 1 || w.OtherCores != 0.5 || w.StealCores != 0.1 ||
		w.RunnableMean != 5 || w.RunnableMax != 9 || w.Load1End != 1.5 {
		t.Errorf("window %+v", w)
	}
	if s := sampleMachine(os.Getpid()); s.busy <= 0 || s.running < 1 || s.ours < 0 {
		t.Errorf("sampleMachine read nothing: %+v", s)
	}
}

// A README row with placeholders documents every key of its family, and
// an exact row still wins over a family that also matches.
func TestDescriptionsOfKeyFamilies(t *testing.T) {
	path := t.TempDir() + "/README.md"
	readme := "| key | what |\n|---|---|\n" +
		"| `gateway_vs_litellm_<mode>_<latency>_c<N>_rps_ratio` | requests/s, gateway over LiteLLM |\n" +
		"| `gateway_vs_litellm_limited_instant_c8_rps_ratio` | the exact row |\n" +
		"| `ingest_events_per_sec` | events/s |\n"
	if err := os.WriteFile(path, []byte(readme), 0o600); err != nil {
		t.Fatal(err)
	}
	desc := descriptions(path)
	for key, want := range map[string]string{
		"gateway_vs_litellm_metered_200ms_c64_rps_ratio":  "requests/s, gateway over LiteLLM",
		"gateway_vs_litellm_limited_instant_c8_rps_ratio": "the exact row",
		"ingest_events_per_sec":                           "events/s",
		"gateway_vs_litellm_metered_200ms_c64_cpu_ratio":  "",
		"gateway_vs_litellm_metered_200ms_64_rps_ratio":   "",
	} {
		if got := desc(key); got != want {
			t.Errorf("description of %s = %q, want %q", key, got, want)
		}
	}
}
