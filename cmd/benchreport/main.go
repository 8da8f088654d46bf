// Command benchreport turns `go test -bench` output into bench/results.json:
// a flat JSON object of result key → number, plus cores, go_version and
// commit, and prints a readable table.
//
// A figure becomes a key when a benchmark reports it with
// b.ReportMetric(value, "<key>"), the unit being the key itself
// (lower_snake_case with the unit in the name: ingest_events_per_sec_batch1000,
// checker_check_ns). Standard ns/op, B/op and allocs/op are not copied: a
// benchmark that wants one in the results reports it under a key. What each
// key measures, and under what load, is described in bench/README.md; the
// table shows that description next to the number.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

var keyPattern = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)+$`)

// parse reads benchmark output and returns every key-shaped metric. When a
// key is reported twice (two -count runs), the last value wins.
func parse(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		// f[1] is the iteration count; then value/unit pairs.
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			if keyPattern.MatchString(f[i+1]) {
				out[f[i+1]] = v
			}
		}
	}
	return out, sc.Err()
}

// descriptions reads "| key | description |" rows from bench/README.md.
func descriptions(path string) map[string]string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if keyPattern.MatchString(key) {
			out[key] = strings.TrimSpace(cells[2])
		}
	}
	return out
}

func main() {
	in := flag.String("in", "-", "benchmark output to read (- for stdin)")
	outPath := flag.String("out", "bench/results.json", "results file to write")
	readme := flag.String("readme", "bench/README.md", "file describing each key")
	flag.Parse()

	var r io.Reader = os.Stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		defer f.Close()
		r = f
	}
	figures, err := parse(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	if len(figures) == 0 {
		fmt.Fprintln(os.Stderr, "benchreport: no result keys found; did the benchmarks run (not -short)?")
		os.Exit(1)
	}
	results := map[string]any{}
	for k, v := range figures {
		results[k] = v
	}
	results["cores"] = runtime.NumCPU()
	results["go_version"] = runtime.Version()
	commit := "unknown"
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(b))
	}
	results["commit"] = commit
	data, _ := json.MarshalIndent(results, "", "  ")
	if err := os.WriteFile(*outPath, append(data, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}

	desc := descriptions(*readme)
	keys := make([]string, 0, len(figures))
	for k := range figures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf("\n%-44s %16s  %s\n", "result", "value", "what was measured")
	for _, k := range keys {
		fmt.Printf("%-44s %16.6g  %s\n", k, figures[k], desc[k])
	}
	fmt.Printf("\n%d figures, %d cores, %s, commit %s → %s\n", len(keys), runtime.NumCPU(), runtime.Version(), commit, *outPath)
}
