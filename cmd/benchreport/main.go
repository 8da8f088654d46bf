// Command benchreport runs the benchmarks of `make bench` and turns their
// output into bench/results.json.
//
// `benchreport run [flags] packages...` builds the test binary of every
// package that has benchmarks, then runs them one package at a time (go
// test -bench over many packages would run up to GOMAXPROCS of them at
// once, competing for the same cores and services), copying the output to
// -raw. After each benchmark's result line it writes a window line: what
// the machine did meanwhile — wall seconds, cores busy, the benchmark
// binary's share, other processes' share, cores stolen by the hypervisor,
// runnable threads, load average — and one more for each package's whole
// run.
//
// `benchreport -in raw.txt -out results.json` reads that output (or plain
// `go test -bench` output) and writes a flat JSON object of result key →
// number, plus cores, go_version, commit, and conditions: the windows, each
// naming the figures its benchmark reported, so that every figure says what
// else ran beside it. With -merge it replaces only the figures of this
// run in an existing file, keeping the others and their windows: the way
// a rerun of one package updates a whole run's file. It prints a readable
// table.
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
	"bytes"
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
// key is reported twice (two -count runs), the last value wins. Window
// lines (benchreport run) come back in order, each with the keys of the
// result line just before it; a package's window names none.
func parse(r io.Reader) (map[string]float64, []Window, error) {
	out := map[string]float64{}
	var windows []Window
	var last []string // keys of the last result line, until its window
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if w, ok := readWindow(sc.Text()); ok {
			if w.Benchmark != "" {
				w.Figures = last
			}
			last = nil
			windows = append(windows, w)
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		last = nil
		// f[1] is the iteration count; then value/unit pairs.
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			if keyPattern.MatchString(f[i+1]) {
				out[f[i+1]] = v
				last = append(last, f[i+1])
			}
		}
	}
	return out, windows, sc.Err()
}

// merge puts the figures and windows of a new run into the results of an
// earlier one: the new figures replace the old, old windows lose the
// figures a new one now names (and go when none is left), and the package
// windows of the packages run again go.
func merge(old map[string]any, figures map[string]float64, windows []Window) (map[string]float64, []Window) {
	all := map[string]float64{}
	for k, v := range old {
		if f, ok := v.(float64); ok && keyPattern.MatchString(k) && k != "go_version" {
			all[k] = f
		}
	}
	var oldWindows []Window
	if raw, err := json.Marshal(old["conditions"]); err == nil {
		_ = json.Unmarshal(raw, &oldWindows)
	}
	rerun := map[string]bool{}
	for _, w := range windows {
		rerun[w.Package] = true
	}
	var kept []Window
	for _, w := range oldWindows {
		if w.Benchmark == "" {
			if !rerun[w.Package] {
				kept = append(kept, w)
			}
			continue
		}
		var left []string
		for _, k := range w.Figures {
			if _, replaced := figures[k]; !replaced {
				left = append(left, k)
			}
		}
		if len(left) > 0 {
			w.Figures = left
			kept = append(kept, w)
		}
	}
	for k, v := range figures {
		all[k] = v
	}
	return all, append(kept, windows...)
}

// descriptions reads "| key | description |" rows from bench/README.md.
// A row may describe a family of keys with placeholders in angle brackets
// (`gateway_vs_litellm_<mode>_<latency>_c<N>_rps_ratio`): each stands for
// one or more lower-case words joined by underscores, so that a benchmark
// reporting a figure per point of a sweep documents it once.
func descriptions(path string) func(key string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return func(string) string { return "" }
	}
	exact := map[string]string{}
	type family struct {
		re   *regexp.Regexp
		desc string
	}
	var families []family
	for _, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[1]), "`")
		desc := strings.TrimSpace(cells[2])
		if keyPattern.MatchString(key) {
			exact[key] = desc
			continue
		}
		if re := templateKey(key); re != nil {
			families = append(families, family{re, desc})
		}
	}
	return func(key string) string {
		if d, ok := exact[key]; ok {
			return d
		}
		for _, f := range families {
			if f.re.MatchString(key) {
				return f.desc
			}
		}
		return ""
	}
}

var placeholder = regexp.MustCompile(`<[A-Za-z]+>`)

// templateKey turns a key with placeholders into the pattern of the keys it
// stands for, or nil when s is not such a key.
func templateKey(s string) *regexp.Regexp {
	if !placeholder.MatchString(s) || !keyPattern.MatchString(placeholder.ReplaceAllString(s, "x")) {
		return nil
	}
	var b strings.Builder
	last := 0
	for _, m := range placeholder.FindAllStringIndex(s, -1) {
		b.WriteString(regexp.QuoteMeta(s[last:m[0]]))
		b.WriteString(`[a-z0-9]+(?:_[a-z0-9]+)*?`)
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(s[last:]))
	return regexp.MustCompile("^" + b.String() + "$")
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "run" {
		if err := runMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		return
	}
	in := flag.String("in", "-", "benchmark output to read (- for stdin)")
	outPath := flag.String("out", "bench/results.json", "results file to write")
	readme := flag.String("readme", "bench/README.md", "file describing each key")
	mergeOld := flag.Bool("merge", false, "replace only this run's figures (and their windows) in an existing -out file")
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
	figures, windows, err := parse(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	if len(figures) == 0 {
		fmt.Fprintln(os.Stderr, "benchreport: no result keys found; did the benchmarks run (not -short)?")
		os.Exit(1)
	}
	commit := gitCommit()
	if *mergeOld {
		data, err := os.ReadFile(*outPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: -merge:", err)
			os.Exit(1)
		}
		var old map[string]any
		if err := json.Unmarshal(data, &old); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: -merge:", *outPath, err)
			os.Exit(1)
		}
		figures, windows = merge(old, figures, windows)
		if c, ok := old["commit"].(string); ok {
			commit = c // the whole run's; each window names its own
		}
	}
	results := map[string]any{}
	for k, v := range figures {
		results[k] = v
	}
	results["cores"] = runtime.NumCPU()
	results["go_version"] = runtime.Version()
	results["commit"] = commit
	if len(windows) > 0 {
		results["conditions"] = windows
	}
	data, _ := json.MarshalIndent(results, "", "  ")
	if err := os.WriteFile(*outPath, append(data, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}

	desc := descriptions(*readme)
	beside := map[string]Window{}
	for _, w := range windows {
		for _, k := range w.Figures {
			beside[k] = w
		}
	}
	keys := make([]string, 0, len(figures))
	for k := range figures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf("\n%-44s %16s %6s %6s  %s\n", "result", "value", "other", "steal", "what was measured (other, steal: cores busy with other processes, and stolen, while it ran)")
	for _, k := range keys {
		other, steal := "", ""
		if w, ok := beside[k]; ok {
			other, steal = fmt.Sprintf("%.2f", w.OtherCores), fmt.Sprintf("%.2f", w.StealCores)
		}
		fmt.Printf("%-44s %16.6g %6s %6s  %s\n", k, figures[k], other, steal, desc(k))
	}
	fmt.Printf("\n%d figures, %d cores, %s, commit %s → %s\n", len(keys), runtime.NumCPU(), runtime.Version(), commit, *outPath)
}

// gitCommit is the checkout's short commit, with "+dirty" when it has
// uncommitted changes, or "unknown".
func gitCommit() string {
	b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(b))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}
