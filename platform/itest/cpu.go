package itest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcStat is /proc/<pid>/stat's fields after the command (which may hold
// spaces, in parentheses): f[0] is field 3 (state), f[1] the parent's pid,
// f[11] and f[12] utime and stime.
func ProcStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	return f, nil
}

// ProcCPU is the user plus system CPU time of a process, all its threads,
// from /proc/<pid>/stat: what benchmarks charge to a server they measure
// from outside (Redis, an ingest process, a peer's daemon).
func ProcCPU(pid int) (time.Duration, error) {
	f, err := ProcStat(pid)
	if err != nil {
		return 0, err
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return Ticks(ut + st), nil
}
