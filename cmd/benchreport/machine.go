package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/stat and /proc/<pid>/stat times (USER_HZ,
// 100 on every Linux this runs on).
const clockTick = 10 * time.Millisecond

// machineSample is what /proc says about the whole machine and one process
// tree at one moment.
type machineSample struct {
	at time.Time
	// busy is CPU time spent by every core on anything (user, nice,
	// system, irq, softirq); steal is time the hypervisor gave to other
	// virtual machines while this one wanted the CPU.
	busy, steal time.Duration
	// ours is the CPU time of the benchmark binary and of the children it
	// has reaped (utime + stime + cutime + cstime): processes it started
	// count once they have exited.
	ours time.Duration
	// running is the number of threads runnable at that moment
	// (/proc/loadavg's fourth field, the benchmark's own included), load1
	// the one-minute load average.
	running int
	load1   float64
}

// sampleMachine reads /proc/stat, /proc/loadavg and, if pid > 0,
// /proc/<pid>/stat. Anything it cannot read stays zero: the figures are
// then reported as zero rather than the run failing.
func sampleMachine(pid int) machineSample {
	s := machineSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		if len(f) > 8 && f[0] == "cpu" {
			for _, i := range []int{1, 2, 3, 6, 7} {
				s.busy += ticks(f[i])
			}
			s.steal = ticks(f[8])
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b)) // 0.52 0.58 0.59 3/456 12345
		if len(f) > 3 {
			s.load1, _ = strconv.ParseFloat(f[0], 64)
			run, _, _ := strings.Cut(f[3], "/")
			s.running, _ = strconv.Atoi(run)
		}
	}
	if pid > 0 {
		s.ours = processTreeCPU(pid)
	}
	return s
}

// processTreeCPU is utime + stime + cutime + cstime of pid.
func processTreeCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count from the ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // state is f[0]; utime is field 14, so f[11]
	if len(f) < 15 {
		return 0
	}
	return ticks(f[11]) + ticks(f[12]) + ticks(f[13]) + ticks(f[14])
}

func ticks(s string) time.Duration {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Duration(n) * clockTick
}

// Window is what the machine did while one benchmark (or one package's
// whole run) ran: the answer to "what else ran beside this figure".
type Window struct {
	// Package is the import path; Benchmark the benchmark's full name
	// (sub-benchmarks included, GOMAXPROCS suffix included), or "" for the
	// package's whole run.
	Package   string `json:"package"`
	Benchmark string `json:"benchmark,omitempty"`
	// Commit is the checkout's commit (with "+dirty" if it had changes)
	// and Started the window's start, UTC.
	Commit  string  `json:"commit"`
	Started string  `json:"started"`
	Seconds float64 `json:"seconds"`
	// BusyCores is every core's busy time over the wall time; OursCores
	// the benchmark binary's share (with the children it reaped);
	// OtherCores the rest: other processes, the shared services
	// (Kafka, ClickHouse, Redis) included, whoever they worked for.
	BusyCores  float64 `json:"busy_cores"`
	OursCores  float64 `json:"ours_cores"`
	OtherCores float64 `json:"other_cores"`
	// StealCores is CPU the hypervisor took for other virtual machines.
	StealCores float64 `json:"steal_cores"`
	// RunnableMean and RunnableMax are threads runnable (the benchmark's
	// own included) over samples taken every SampleEvery; Load1End is the
	// one-minute load average at the end.
	RunnableMean float64 `json:"runnable_mean"`
	RunnableMax  int     `json:"runnable_max"`
	Load1End     float64 `json:"load1_end"`
	// Figures are the result keys the benchmark reported (filled in by
	// the report, not the runner).
	Figures []string `json:"figures,omitempty"`
}

// window computes a Window from the samples at its start and end and the
// periodic samples between them.
func window(pkg, bench string, start, end machineSample, between []machineSample) Window {
	wall := end.at.Sub(start.at)
	w := Window{Package: pkg, Benchmark: bench, Seconds: round3(wall.Seconds()), Load1End: end.load1}
	if wall <= 0 {
		return w
	}
	cores := func(d time.Duration) float64 { return round3(max(d.Seconds()/wall.Seconds(), 0)) }
	w.BusyCores = cores(end.busy - start.busy)
	w.OursCores = cores(end.ours - start.ours)
	w.OtherCores = cores(end.busy - start.busy - (end.ours - start.ours))
	w.StealCores = cores(end.steal - start.steal)
	n, sum := 0, 0
	for _, s := range append(append([]machineSample{start}, between...), end) {
		if s.at.Before(start.at) || s.at.After(end.at) {
			continue
		}
		n++
		sum += s.running
		w.RunnableMax = max(w.RunnableMax, s.running)
	}
	if n > 0 {
		w.RunnableMean = round3(float64(sum) / float64(n))
	}
	return w
}

func round3(v float64) float64 {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', 3, 64), 64)
	return r
}
