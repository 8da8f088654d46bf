package itest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

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
