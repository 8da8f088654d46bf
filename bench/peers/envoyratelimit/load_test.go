package envoyratelimitbench

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// decider decides one request of key k under both rules. failed is set
// when the answer did not come from the limiter's state (Sluice's fail
// mode). Neither side here names the window it counted a request in (the
// Envoy service answers a 1 s unit's reset as 1 s whenever it is asked),
// so the overshoot finds the window from the load generator's clock.
type decider func(ctx context.Context, k int) (allowed, failed bool, err error)

// side is one limiter under test and how to charge its CPU.
type side struct {
	name   string
	decide decider
	// servers are the pids of the processes that decide outside this
	// one: Redis, and the Envoy service in front of it.
	servers []int
	// commands, when set, is the server's count of commands processed so
	// far: what else used a server other tests share.
	commands func() int64
	// alignedWindow is set when the window limit counts in fixed windows
	// aligned to the clock (the Envoy service's: a 1 s unit is each Unix
	// second).
	alignedWindow bool
}

// load is what the load generator sends: clients goroutines, each in a
// closed loop (the next request when the last is answered), each request
// for one of keys keys drawn uniformly, for dur.
type load struct {
	keys, clients int
	dur           time.Duration
	// record keeps every admission for the overshoot.
	record bool
}

// event is one admission as the load generator saw it: the limiter
// decided it between sent and at (Unix ns).
type event struct {
	key      int
	sent, at int64
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
func (c *client) loop(ctx context.Context, s side, ld load, rng *rand.Rand, end time.Time) {
	c.lat = make([]time.Duration, 0, latSamples)
	for {
		k := rng.IntN(ld.keys)
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		ok, failed, err := s.decide(ctx, k)
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
			if ld.record {
				c.events = append(c.events, event{key: k, sent: t0.UnixNano(), at: t1.UnixNano()})
			}
		}
	}
}

// drive runs ld against s and measures it: the process's own CPU
// (getrusage: the limiter's client and the load generator) and the
// server's (/proc) over the run.
func drive(b *testing.B, s side, ld load) result {
	b.Helper()
	ctx := context.Background()
	clients := make([]client, ld.clients)
	var wg sync.WaitGroup
	srv0, cmd0 := serverCPU(b, s), commands(s)
	own0, start := processCPU(), time.Now()
	end := start.Add(ld.dur)
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

func serverCPU(b *testing.B, s side) time.Duration {
	var all time.Duration
	for _, pid := range s.servers {
		d, err := itest.ProcCPU(pid)
		if err != nil {
			b.Fatalf("%s: CPU of server pid %d: %v", s.name, pid, err)
		}
		all += d
	}
	return all
}

func commands(s side) int64 {
	if s.commands == nil {
		return 0
	}
	return s.commands()
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// slidingOvershoot is the worst key's admissions above limit in any span
// shorter than span, as a share of limit. The load generator knows only
// that an admission was decided between sending the request and reading
// the answer; on a busy machine the answer may be read many milliseconds
// later, and timestamps taken then bunch admissions of adjacent spans
// together. So an admission counts in a span only when both ends lie
// within it: the overshoot the limiter certainly made (every limiter is
// judged so).
func slidingOvershoot(events []event, keys int, limit int64, span time.Duration) float64 {
	perKey := make([][]event, keys)
	for _, e := range events {
		perKey[e.key] = append(perKey[e.key], e)
	}
	var worst int64
	for _, ev := range perKey {
		slices.SortFunc(ev, func(a, b event) int { return cmp.Compare(a.sent, b.sent) })
		for i := range ev {
			end := ev[i].sent + int64(span)
			var n int64
			for j := i; j < len(ev) && ev[j].sent < end; j++ {
				if ev[j].at < end {
					n++
				}
			}
			worst = max(worst, n)
		}
	}
	return float64(max(worst-limit, 0)) / float64(limit)
}

// alignedOvershoot is the worst key's admissions above limit in one of the
// clock-aligned fixed windows of length window (a Unix second for the Envoy
// service's unit second), as a share of limit. Like slidingOvershoot it
// counts an admission only where the limiter certainly made it: in the
// window that holds both the request's sending and its answer's reading;
// one that spans two windows may have been counted in either, and counts
// in neither.
func alignedOvershoot(events []event, limit int64, window time.Duration) float64 {
	perWindow := map[[2]int64]int64{}
	var worst int64
	for _, e := range events {
		w := e.sent / int64(window)
		if e.at/int64(window) != w {
			continue
		}
		k := [2]int64{int64(e.key), w}
		perWindow[k]++
		worst = max(worst, perWindow[k])
	}
	return float64(max(worst-limit, 0)) / float64(limit)
}
