// Package resource samples the process's CPU and memory use — against the
// cgroup v2 limits when the process runs in a container, else against the
// machine — for the gateway's degradation levels (seed 003: levels at
// 50/70/90% of CPU and memory). A background Sampler reads them every
// interval and keeps the result in atomics, so that reading the load on
// the request path costs an atomic load and no system call.
package resource

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Reading is one reading of the process's resources.
type Reading struct {
	// CPUSeconds is the CPU time the process has used so far (user and
	// system); CPULimit the cores it may use (the cgroup's cpu.max quota
	// over its period, else the machine's CPUs).
	CPUSeconds, CPULimit float64
	// MemoryBytes is the memory in use (the cgroup's memory.current, else
	// the process's resident set) and MemoryLimit what it may use (the
	// cgroup's memory.max, else the machine's memory); 0: unknown.
	MemoryBytes, MemoryLimit uint64
}

// Reader reads the process's resources; System reads the real ones, tests
// give their own.
type Reader interface {
	Read() (Reading, error)
}

// System reads the process's resources from the operating system: CPU time
// from getrusage, limits and memory from cgroup v2 (the process's own
// cgroup under CgroupRoot, as /proc/self/cgroup names it) when it sets
// them, else the process's resident set and the machine's memory from
// /proc.
type System struct {
	// CgroupRoot is where the cgroup v2 hierarchy is mounted (default
	// /sys/fs/cgroup); Proc is procfs (default /proc).
	CgroupRoot, Proc string
}

// Read implements Reader.
func (s System) Read() (Reading, error) {
	root, proc := s.CgroupRoot, s.Proc
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	if proc == "" {
		proc = "/proc"
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return Reading{}, fmt.Errorf("resource: getrusage: %w", err)
	}
	r := Reading{CPUSeconds: tv(ru.Utime) + tv(ru.Stime), CPULimit: float64(runtime.NumCPU())}
	dir := cgroupDir(root, proc)
	if q, ok := cpuMax(filepath.Join(dir, "cpu.max")); ok {
		r.CPULimit = q
	}
	if limit, ok := readUint(filepath.Join(dir, "memory.max")); ok {
		if cur, ok := readUint(filepath.Join(dir, "memory.current")); ok {
			r.MemoryBytes, r.MemoryLimit = cur, limit
			return r, nil
		}
	}
	r.MemoryBytes = rss(proc)
	r.MemoryLimit = memTotal(proc)
	if r.MemoryBytes == 0 || r.MemoryLimit == 0 {
		return r, errors.New("resource: no memory reading (no cgroup v2 memory.max, nor /proc/self/statm and /proc/meminfo)")
	}
	return r, nil
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// cgroupDir is the process's cgroup v2 directory ("0::/path" in
// /proc/self/cgroup); in a container's namespace that is the root itself.
func cgroupDir(root, proc string) string {
	b, err := os.ReadFile(filepath.Join(proc, "self", "cgroup"))
	if err != nil {
		return root
	}
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return filepath.Join(root, filepath.Clean("/"+p))
		}
	}
	return root
}

// cpuMax reads cpu.max ("quota period", or "max period" for no limit).
func cpuMax(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0, false
	}
	return q / p, true
}

// readUint reads a file holding one number ("max" is no limit: false).
func readUint(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	return v, err == nil && v > 0
}

func rss(proc string) uint64 {
	b, err := os.ReadFile(filepath.Join(proc, "self", "statm"))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}

func memTotal(proc string) uint64 {
	f, err := os.Open(filepath.Join(proc, "meminfo"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			fs := strings.Fields(rest)
			if len(fs) >= 1 {
				kb, err := strconv.ParseUint(fs[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}

// Config is resource sampling's configuration.
type Config struct {
	Enabled  bool          `yaml:"enabled" help:"degrade every guarded upstream by the process's CPU and memory use too (against the container's cgroup v2 limits when set): the load its degradation levels follow is the highest of its calls in flight and waiting against its room, CPU and memory"`
	Interval time.Duration `yaml:"interval" help:"how often the CPU and memory are sampled (in the background: a request reads the last sample)"`
	CPU      bool          `yaml:"cpu" help:"CPU use (CPU time over the interval against the cores the process may use) is an input"`
	Memory   bool          `yaml:"memory" help:"memory use (against the cgroup's memory.max, else the machine's memory) is an input"`
}

// DefaultConfig is off; when on, both CPU and memory every second.
func DefaultConfig() Config { return Config{Interval: time.Second, CPU: true, Memory: true} }

// Validate names the field and the limit it crosses; prefix is the
// section's path (with its trailing dot).
func (c Config) Validate(prefix string) error {
	var errs []error
	if c.Interval < 100*time.Millisecond || c.Interval > time.Minute {
		errs = append(errs, fmt.Errorf("%sinterval: %v is outside 100ms..1m", prefix, c.Interval))
	}
	if c.Enabled && !c.CPU && !c.Memory {
		errs = append(errs, fmt.Errorf("%senabled: true with neither cpu nor memory: set one, or disable", prefix))
	}
	return errors.Join(errs...)
}

// Sampler keeps the last CPU and memory use, each a fraction of its limit
// (1 is the whole limit; CPU may read above 1 briefly). Safe for
// concurrent use: Load, CPU and Memory are atomic loads.
type Sampler struct {
	r   Reader
	cfg Config
	now func() time.Time

	mu     sync.Mutex // serialises Sample
	last   Reading
	lastAt time.Time

	cpu, mem atomic.Uint64 // math.Float64bits
}

// NewSampler returns a Sampler of r under cfg (which must validate); now
// is the clock (nil: time.Now). Nothing is read until Sample or Run.
func NewSampler(r Reader, cfg Config, now func() time.Time) *Sampler {
	if now == nil {
		now = time.Now
	}
	return &Sampler{r: r, cfg: cfg, now: now}
}

// Sample reads once. CPU use is the CPU time since the previous reading
// over the wall time since, against the limit: the first reading only
// sets the baseline. On an error the previous values stay.
func (s *Sampler) Sample() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.r.Read()
	at := s.now()
	if err != nil {
		return err
	}
	if !s.lastAt.IsZero() && r.CPULimit > 0 {
		if wall := at.Sub(s.lastAt).Seconds(); wall > 0 {
			s.cpu.Store(math.Float64bits(math.Max(0, r.CPUSeconds-s.last.CPUSeconds) / (wall * r.CPULimit)))
		}
	}
	if r.MemoryLimit > 0 {
		s.mem.Store(math.Float64bits(float64(r.MemoryBytes) / float64(r.MemoryLimit)))
	}
	s.last, s.lastAt = r, at
	return nil
}

// Run samples every interval until ctx ends; onErr (nil: ignored) learns
// each failed reading. It returns nil.
func (s *Sampler) Run(ctx context.Context, onErr func(error)) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if err := s.Sample(); err != nil && onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// CPU is the last CPU use, a fraction of the cores the process may use.
func (s *Sampler) CPU() float64 { return math.Float64frombits(s.cpu.Load()) }

// Memory is the last memory use, a fraction of the limit.
func (s *Sampler) Memory() float64 { return math.Float64frombits(s.mem.Load()) }

// Load is the highest of the configured inputs (CPU, memory), the figure
// the degradation levels follow next to the upstream's own load.
func (s *Sampler) Load() float64 {
	v := 0.0
	if s.cfg.CPU {
		v = s.CPU()
	}
	if s.cfg.Memory {
		v = math.Max(v, s.Memory())
	}
	return v
}
