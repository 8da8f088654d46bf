package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// windowPrefix starts the lines the runner adds to the raw output: a
// Window as JSON. They follow the result line of the benchmark they
// describe; the package's own window follows its last benchmark.
const windowPrefix = "benchreport-window: "

// sampleEvery is how often the runner samples the machine between a
// benchmark's start and its result.
const sampleEvery = time.Second

// runMain is `benchreport run`: it builds the test binary of every package
// that has benchmarks, then runs those binaries one at a time, so that no
// two packages' benchmarks share the machine (go test -bench over many
// packages runs up to GOMAXPROCS test binaries at once). Each benchmark's
// output is copied to stdout and to -raw, followed by a line that says
// what else ran meanwhile.
func runMain(args []string) error {
	fs := flag.NewFlagSet("benchreport run", flag.ExitOnError)
	raw := fs.String("raw", "bench/raw.txt", "file to write the benchmark output to")
	bench := fs.String("bench", ".", "benchmarks to run (go test -bench)")
	benchtime := fs.String("benchtime", "", "go test -benchtime, if set")
	count := fs.Int("count", 1, "go test -count")
	timeout := fs.String("timeout", "30m", "go test -timeout, per package")
	goCmd := fs.String("go", "go", "the go command")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: benchreport run [flags] packages...")
		fs.PrintDefaults()
	}
	_ = fs.Parse(args)
	if fs.NArg() == 0 {
		fs.Usage()
		os.Exit(2)
	}
	pkgs, err := benchPackages(*goCmd, fs.Args())
	if err != nil {
		return err
	}
	if len(pkgs) == 0 {
		return errors.New("no package with benchmarks among " + strings.Join(fs.Args(), " "))
	}
	bin, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	// Every binary is built before the first runs: compiling beside a
	// benchmark would be one more thing running beside it.
	for i := range pkgs {
		p := &pkgs[i]
		p.bin = filepath.Join(bin, fmt.Sprintf("%02d.test", i))
		fmt.Fprintf(os.Stderr, "benchreport: building %s\n", p.path)
		cmd := exec.Command(*goCmd, "test", "-c", "-o", p.bin, p.path)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building %s: %w", p.path, err)
		}
	}
	out, err := os.Create(*raw)
	if err != nil {
		return err
	}
	defer out.Close()
	w := io.MultiWriter(os.Stdout, out)
	flags := []string{"-test.run", "^$", "-test.bench", *bench, "-test.benchmem", "-test.v",
		"-test.count", fmt.Sprint(*count), "-test.timeout", *timeout}
	if *benchtime != "" {
		flags = append(flags, "-test.benchtime", *benchtime)
	}
	var failed []string
	for _, p := range pkgs {
		if !hasBenchmark(p, *bench) {
			continue
		}
		if err := runPackage(w, p, flags, gitCommit()); err != nil {
			fmt.Fprintf(w, "FAIL\t%s\t%v\n", p.path, err)
			failed = append(failed, p.path)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("benchmarks failed in %s (the others' figures are in %s)", strings.Join(failed, ", "), *raw)
	}
	return nil
}

type benchPackage struct {
	path, dir, bin string
}

var benchFunc = regexp.MustCompile(`(?m)^func Benchmark[A-Z_0-9]`)

// benchPackages lists the packages matching patterns whose test files
// declare a benchmark.
func benchPackages(goCmd string, patterns []string) ([]benchPackage, error) {
	cmd := exec.Command(goCmd, append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .TestGoFiles \" \"}} {{join .XTestGoFiles \" \"}}"}, patterns...)...)
	cmd.Stderr = os.Stderr
	listing, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var out []benchPackage
	for _, line := range strings.Split(strings.TrimSpace(string(listing)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 {
			continue
		}
		for _, name := range strings.Fields(f[2]) {
			src, err := os.ReadFile(filepath.Join(f[1], name))
			if err == nil && benchFunc.Match(src) {
				out = append(out, benchPackage{path: f[0], dir: f[1]})
				break
			}
		}
	}
	return out, nil
}

// hasBenchmark tells whether p's test binary has a top-level benchmark
// that the -bench pattern selects (its first element: a sub-benchmark
// pattern is the binary's business).
func hasBenchmark(p benchPackage, pattern string) bool {
	top, _, _ := strings.Cut(pattern, "/")
	out, err := exec.Command(p.bin, "-test.list", top).Output()
	if err != nil {
		return true // let the run say what is wrong
	}
	for _, name := range strings.Fields(string(out)) {
		if strings.HasPrefix(name, "Benchmark") {
			return true
		}
	}
	return false
}

// runPackage runs one package's test binary in its directory (as go test
// does) and writes its output to w, each result line followed by its
// window, then the package's window.
func runPackage(w io.Writer, p benchPackage, flags []string, commit string) error {
	cmd := exec.Command(p.bin, flags...)
	cmd.Dir = p.dir
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	pkgStart := sampleMachine(0)
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	pkgStart.ours = 0 // the binary had not run yet

	var mu sync.Mutex
	var samples []machineSample
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s := sampleMachine(pid)
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
			}
		}
	}()
	between := func(from time.Time) []machineSample {
		mu.Lock()
		defer mu.Unlock()
		var out []machineSample
		for _, s := range samples {
			if !s.at.Before(from) {
				out = append(out, s)
			}
		}
		return out
	}

	started := map[string]machineSample{} // benchmark name (no -N suffix) → sample at its start
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if len(f) == 1 { // -test.v prints the name alone when a benchmark starts
			started[f[0]] = sampleMachine(pid)
			continue
		}
		if !isResultLine(f) {
			continue
		}
		name := f[0]
		start, ok := started[name]
		if !ok { // the usual case: the name with its -GOMAXPROCS suffix
			name = trimProcs(name)
			if start, ok = started[name]; !ok {
				continue
			}
		}
		end := sampleMachine(pid)
		started[name] = end // the next -count run of it starts here
		win := window(p.path, f[0], start, end, between(start.at))
		win.Commit, win.Started = commit, start.at.UTC().Format(time.RFC3339)
		b, _ := json.Marshal(win)
		fmt.Fprintf(w, "%s%s\n", windowPrefix, b)
	}
	_, _ = io.Copy(io.Discard, stdout)
	waitErr := cmd.Wait()
	close(stop)
	<-sampled
	pkgEnd := sampleMachine(0)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		pkgEnd.ours = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	win := window(p.path, "", pkgStart, pkgEnd, between(pkgStart.at))
	win.Commit, win.Started = commit, pkgStart.at.UTC().Format(time.RFC3339)
	b, _ := json.Marshal(win)
	fmt.Fprintf(w, "%s%s\n", windowPrefix, b)
	if waitErr != nil {
		return waitErr
	}
	return sc.Err()
}

// isResultLine tells a benchmark's result line (name, iterations, then
// value/unit pairs) from a line the benchmark printed that happens to start
// with its name.
func isResultLine(f []string) bool {
	if len(f) < 4 {
		return false
	}
	for _, c := range []byte(f[1]) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// trimProcs removes the -GOMAXPROCS suffix go test adds to a benchmark's
// name in its result line.
func trimProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name
	}
	for _, c := range []byte(name[i+1:]) {
		if c < '0' || c > '9' {
			return name
		}
	}
	if i+1 == len(name) {
		return name
	}
	return name[:i]
}

// readWindow parses a line the runner wrote, or reports false.
func readWindow(line string) (Window, bool) {
	rest, ok := strings.CutPrefix(line, windowPrefix)
	if !ok {
		return Window{}, false
	}
	var w Window
	if err := json.NewDecoder(bytes.NewReader([]byte(rest))).Decode(&w); err != nil {
		return Window{}, false
	}
	return w, true
}
