package itest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PidCPU is the user plus system CPU time of a process, all its threads,
// from /proc/<pid>/stat: what benchmarks charge a service process (the
// broker's JVM, ClickHouse, a `sluice run`) for the work they measure.
func PidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) in parentheses:
	// state is field 3, utime 14 and stime 15.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return Ticks(ut + st), nil
}

// Ticks converts clock ticks of /proc (USER_HZ, 100 on Linux) to time.
func Ticks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond }

// Switches counts a process's context switches: voluntary (a thread
// blocked: waiting on a socket, a futex, a timer) and involuntary (the
// scheduler took the core from a running thread).
type Switches struct{ Voluntary, Involuntary int64 }

// ContextSwitches sums the context switches of every live thread of a
// process (/proc/<pid>/task/*/status; the process's own status counts
// only its main thread). Threads that ended meanwhile are not counted,
// so compare figures of processes whose threads live long (Go runtimes,
// the broker's JVM).
func ContextSwitches(pid int) (Switches, error) {
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(dirs) == 0 {
		return Switches{}, fmt.Errorf("threads of process %d: none readable (%v)", pid, err)
	}
	var s Switches
	for _, path := range dirs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended between the listing and the read
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, val, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil {
				continue
			}
			switch name {
			case "voluntary_ctxt_switches":
				s.Voluntary += n
			case "nonvoluntary_ctxt_switches":
				s.Involuntary += n
			}
		}
	}
	return s, nil
}
