package resource_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sdk/go/resource"
)

// cgroupTree writes a cgroup v2 hierarchy with the process in
// /kubepods/pod1 and a procfs naming it, with the given files there.
func cgroupTree(t *testing.T, files map[string]string) resource.System {
	t.Helper()
	root, proc := t.TempDir(), t.TempDir()
	dir := filepath.Join(root, "kubepods", "pod1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	self := filepath.Join(proc, "self")
	if err := os.MkdirAll(self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(self, "cgroup"), []byte("0::/kubepods/pod1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The fallbacks: 300 resident pages, 8 GiB of machine.
	if err := os.WriteFile(filepath.Join(self, "statm"), []byte("1000 300 10 1 0 100 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "meminfo"), []byte("MemTotal:        8388608 kB\nMemFree: 1 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return resource.System{CgroupRoot: root, Proc: proc}
}

// TestSystemReadsTheContainersLimits: in a container, the cores are
// cpu.max's quota over its period and the memory is memory.current
// against memory.max, in the process's own cgroup.
func TestSystemReadsTheContainersLimits(t *testing.T) {
	s := cgroupTree(t, map[string]string{"cpu.max": "150000 100000\n", "memory.max": "536870912\n", "memory.current": "134217728\n"})
	r, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	if r.CPULimit != 1.5 || r.MemoryLimit != 512<<20 || r.MemoryBytes != 128<<20 || r.CPUSeconds <= 0 {
		t.Fatalf("Read = %+v; want 1.5 cores, 128 MiB of 512 MiB, some CPU time", r)
	}
}

// TestSystemWithoutLimitsReadsTheMachine: "max" (no limit) in cpu.max and
// memory.max falls back to the machine's CPUs and memory and the
// process's resident set.
func TestSystemWithoutLimitsReadsTheMachine(t *testing.T) {
	s := cgroupTree(t, map[string]string{"cpu.max": "max 100000\n", "memory.max": "max\n", "memory.current": "134217728\n"})
	r, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	if r.CPULimit < 1 || r.MemoryLimit != 8<<30 || r.MemoryBytes != uint64(300*os.Getpagesize()) {
		t.Fatalf("Read = %+v; want the machine's CPUs, 8 GiB and 300 pages", r)
	}
	// And the real system of the machine running the test.
	if r, err := (resource.System{}).Read(); err != nil || r.CPULimit <= 0 || r.MemoryLimit == 0 || r.MemoryBytes == 0 {
		t.Fatalf("the real system: %+v, %v", r, err)
	}
}

type fixed struct{ r resource.Reading }

func (f *fixed) Read() (resource.Reading, error) { return f.r, nil }

// TestSamplerComputesUseOverTheInterval: CPU use is the CPU time spent
// between two readings over the wall time and the cores (the first
// reading is the baseline), memory use the bytes over the limit; Load is
// the higher of the configured ones.
func TestSamplerComputesUseOverTheInterval(t *testing.T) {
	f := &fixed{resource.Reading{CPUSeconds: 10, CPULimit: 4, MemoryBytes: 300, MemoryLimit: 1000}}
	now := time.Unix(0, 0)
	cfg := resource.DefaultConfig()
	s := resource.NewSampler(f, cfg, func() time.Time { return now })
	if err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	if s.CPU() != 0 || s.Memory() != 0.3 {
		t.Fatalf("after the baseline: cpu %v, memory %v; want 0, 0.3", s.CPU(), s.Memory())
	}
	now = now.Add(2 * time.Second)
	f.r.CPUSeconds += 6 // 3 of 4 cores for 2 s
	if err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	if s.CPU() != 0.75 || s.Load() != 0.75 {
		t.Fatalf("cpu %v, load %v; want 0.75", s.CPU(), s.Load())
	}
	cfg.CPU = false
	if l := resource.NewSampler(f, cfg, nil); l.Load() != 0 {
		t.Fatalf("a sampler that has not sampled loads %v", l.Load())
	}
	memOnly := resource.NewSampler(f, cfg, func() time.Time { return now })
	_ = memOnly.Sample()
	if memOnly.Load() != 0.3 {
		t.Fatalf("memory-only load %v; want 0.3", memOnly.Load())
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	c := resource.DefaultConfig()
	if err := c.Validate("x."); err != nil {
		t.Fatal(err)
	}
	c.Enabled, c.CPU, c.Memory, c.Interval = true, false, false, time.Millisecond
	err := c.Validate("services.gateway.resource_degradation.")
	if err == nil || !strings.Contains(err.Error(), "resource_degradation.interval: 1ms is outside 100ms..1m") ||
		!strings.Contains(err.Error(), "resource_degradation.enabled") {
		t.Fatalf("Validate = %v", err)
	}
}
