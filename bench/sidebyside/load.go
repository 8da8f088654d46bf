package sidebyside

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// Decider decides one request of key k under both rules. reset names the
// fixed window the request was counted in, for a limiter that answers it
// (gubernator's reset_time, Unix ms; see FixedReset), 0 otherwise; failed
// is set when the answer did not come from the limiter's state (Sluice's
// fail mode).
type Decider func(ctx context.Context, k int) (allowed bool, reset int64, failed bool, err error)

// Window is how a side's window limit counts, and so what its own promise
// of at most the limit per window means for the overshoot.
type Window int

const (
	// Sliding is Sluice's window, counted in admission.Granules granules:
	// at most the limit in any span one granule shorter than the window.
	Sliding Window = iota
	// FixedReset is a fixed window the limiter names by its end in each
	// answer (gubernator's reset_time).
	FixedReset
	// FixedAligned is a fixed window aligned to the clock (the Envoy
	// ratelimit service's units: a unit second is each Unix second); its
	// answers do not name it.
	FixedAligned
)

// Side is one limiter under test and how to charge its CPU.
type Side struct {
	// Name is the side's part of its keys: admission_peer_<Name>_<figure>.
	Name   string
	Decide Decider
	// Servers are the pids of the processes that decide outside the
	// benchmark's own (Redis, a peer's daemon), whose CPU is the side's.
	Servers []int
	// Commands, when set, is Redis's count of commands processed so far:
	// what else used a server other tests share.
	Commands func() int64
	Window   Window
}

// Load is what the load generator sends: Clients goroutines, each in a
// closed loop (the next request when the last is answered), each request
// for one of Keys keys drawn uniformly, for Dur.
type Load struct {
	Keys, Clients int
	Dur           time.Duration
	// Record keeps every admission for the overshoot.
	Record bool
}

// KeyName is the name of key k, which each side scopes to itself.
func KeyName(k int) string { return "key-" + strconv.Itoa(k) }

// event is one admission as the load generator saw it: the limiter
// decided it between sent and at (Unix ns).
type event struct {
	key             int
	sent, at, reset int64
}

// result is what one run of a side under a load did.
type result struct {
	decisions, allowed, failed, errs int64
	wall, ownCPU, serverCPU          time.Duration
	commands                         int64
	lat                              []time.Duration
	events                           []event
}

// latSamples is how many latencies each client keeps (the last ones): a
// fixed cost per decision, whatever the rate.
const latSamples = 1 << 14

// client is one goroutine's share of a run.
type client struct {
	n, allowed, failed, errs int64
	lat                      []time.Duration
	events                   []event
}

// loop sends requests until end.
func (c *client) loop(ctx context.Context, s Side, ld Load, rng *rand.Rand, end time.Time) {
	c.lat = make([]time.Duration, 0, latSamples)
	for {
		k := rng.IntN(ld.Keys)
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		ok, reset, failed, err := s.Decide(ctx, k)
		t1 := time.Now()
		if len(c.lat) < latSamples {
			c.lat = append(c.lat, t1.Sub(t0))
		} else {
			c.lat[c.n&(latSamples-1)] = t1.Sub(t0)
		}
		c.n++
		switch {
		case err != nil:
			c.errs++
		case failed:
			c.failed++
		case ok:
			c.allowed++
			if ld.Record {
				c.events = append(c.events, event{key: k, sent: t0.UnixNano(), at: t1.UnixNano(), reset: reset})
			}
		}
	}
}

// drive runs ld against s and measures it: the process's own CPU
// (getrusage: the limiter's client and the load generator) and the
// servers' (/proc) over the run.
func drive(b *testing.B, s Side, ld Load) result {
	b.Helper()
	ctx := context.Background()
	clients := make([]client, ld.Clients)
	var wg sync.WaitGroup
	srv0, cmd0 := serverCPU(b, s), commands(s)
	own0, start := processCPU(), time.Now()
	end := start.Add(ld.Dur)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clients[i].loop(ctx, s, ld, rand.New(rand.NewPCG(uint64(i)+1, 37)), end)
		}()
	}
	wg.Wait()
	r := result{wall: time.Since(start), ownCPU: processCPU() - own0}
	r.serverCPU, r.commands = serverCPU(b, s)-srv0, commands(s)-cmd0
	for _, c := range clients {
		r.decisions += c.n
		r.allowed += c.allowed
		r.failed += c.failed
		r.errs += c.errs
		r.lat = append(r.lat, c.lat...)
		r.events = append(r.events, c.events...)
	}
	return r
}

// LoadGenCPU runs the load generator alone, with a decider that answers at
// once, under open's keys and clients for a second, and returns its CPU per
// decision (ns): what Measure takes out of every side's client CPU.
func LoadGenCPU(b *testing.B, open Load) float64 {
	b.Helper()
	null := drive(b, Side{Name: "null", Decide: func(context.Context, int) (bool, int64, bool, error) {
		return true, 0, false, nil
	}}, Load{Keys: open.Keys, Clients: open.Clients, Dur: time.Second})
	return float64(null.ownCPU) / float64(null.decisions)
}

func serverCPU(b *testing.B, s Side) time.Duration {
	var all time.Duration
	for _, pid := range s.Servers {
		d, err := itest.ProcCPU(pid)
		if err != nil {
			b.Fatalf("%s: CPU of server pid %d: %v", s.Name, pid, err)
		}
		all += d
	}
	return all
}

func commands(s Side) int64 {
	if s.Commands == nil {
		return 0
	}
	return s.Commands()
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
