package itest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file holds what the growth-curve benchmarks (issue 19, keys
// scale_*) share: the sizes to run and the CPU a piece of work cost the
// process and Redis.

// ScaleSizes returns sizes, or the counts listed in SLUICE_SCALE_SIZES
// (e.g. "1000,10000") to run fewer or others; a bad list fails t.
func ScaleSizes(t testing.TB, sizes ...int) []int {
	t.Helper()
	v := os.Getenv("SLUICE_SCALE_SIZES")
	if v == "" {
		return sizes
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			t.Fatalf("SLUICE_SCALE_SIZES=%q: %q is not a positive count", v, f)
		}
		out = append(out, n)
	}
	return out
}

// EnvCount returns the positive count in the environment variable name,
// or def when it is unset; anything else fails t. Benchmarks take their
// sizes from it (SLUICE_CH_COST_ROWS=100000) to run longer or shorter.
func EnvCount(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// ProcessCPU is the CPU time the process has used, user and system.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RedisCPU is the CPU time Redis has used, user and system, from INFO cpu
// (summed over the masters of a cluster). A shared Redis counts its other
// clients' work too: compare figures taken close together.
func RedisCPU(t testing.TB, rdb redis.UniversalClient) time.Duration {
	t.Helper()
	info, err := rdb.InfoMap(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatalf("INFO cpu: %v", err)
	}
	var sec float64
	for _, fields := range info {
		for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, err := strconv.ParseFloat(fields[k], 64)
			if err != nil {
				t.Fatalf("INFO cpu %s %q: %v", k, fields[k], err)
			}
			sec += v
		}
	}
	return time.Duration(sec * float64(time.Second))
}
