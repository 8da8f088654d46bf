package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// childEnv carries a childConfig to a re-executed test binary: the test
// runs real gateway processes, each with its own Limiter and connections.
const childEnv = "SLUICE_ADMISSION_CHILD"

type childConfig struct {
	Addr       string `json:"addr"`
	Prefix     string `json:"prefix"`
	Limit      int64  `json:"limit"`
	Goroutines int    `json:"goroutines"`
	Attempts   int    `json:"attempts"`
	StartNs    int64  `json:"start_ns"`
}

type childResult struct {
	Allowed     int64 `json:"allowed"`
	Refused     int64 `json:"refused"`
	Unavailable int64 `json:"unavailable"`
}

// exactRule is the rule the processes compete for.
func exactRule(limit int64) Rule {
	return Rule{Name: "exact-rpm", Unit: Requests, Algorithm: SlidingWindow, Limit: limit, Window: time.Hour, Exact: true}
}

// gatewayProcess is the config a re-executed gateway process reads from
// its environment: limiter gives the Redis address, how many connections
// the process pools, the one shared rule and the Limiter's options.
type gatewayProcess interface {
	limiter() (addr string, pool int, rule Rule, opts []Option)
}

// startGateway starts a re-executed gateway process (childMain,
// overshootMain): it reads cfg from the environment variable env, then
// builds the process's Limiter on connections of its own, with the one
// shared rule and tenants failing closed, so that no process admits
// beyond the limit when Redis does not answer. A failure is printed for
// the parent, which shows the child's stderr; the process then exits 2.
func startGateway(env string, cfg gatewayProcess) (*Limiter, *redis.Client, bool) {
	if err := json.Unmarshal([]byte(os.Getenv(env)), cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return nil, nil, false
	}
	addr, pool, rule, opts := cfg.limiter()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: pool})
	l, err := New(c, &Rules{Shared: []Rule{rule}, Default: TenantRules{FailMode: FailClosed}}, opts...)
	if err != nil {
		c.Close()
		fmt.Fprintln(os.Stderr, err)
		return nil, nil, false
	}
	return l, c, true
}

func (cfg *childConfig) limiter() (string, int, Rule, []Option) {
	return cfg.Addr, cfg.Goroutines, exactRule(cfg.Limit), []Option{WithPrefix(cfg.Prefix), WithMaxWait(5 * time.Second), WithRefusalCache(0)}
}

// childMain is a gateway process of TestExactRuleAcrossProcesses.
func childMain() int {
	var cfg childConfig
	l, c, ok := startGateway(childEnv, &cfg)
	if !ok {
		return 2
	}
	defer c.Close()
	defer l.Close()
	time.Sleep(time.Until(time.Unix(0, cfg.StartNs)))
	var res childResult
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cfg.Attempts {
				tk, err := l.Admit(context.Background(), Request{Tenant: fmt.Sprintf("t%d", g%7), Model: "m", User: fmt.Sprint(i)})
				switch {
				case err != nil:
					fmt.Fprintln(os.Stderr, err)
					atomic.AddInt64(&res.Unavailable, 1)
				case tk.Allowed():
					atomic.AddInt64(&res.Allowed, 1)
				case tk.Decision.Path == PathUnavailable:
					atomic.AddInt64(&res.Unavailable, 1)
				default:
					atomic.AddInt64(&res.Refused, 1)
				}
			}
		}()
	}
	wg.Wait()
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// TestExactRuleAcrossProcesses: 4 gateway processes of 50 goroutines each
// compete for one exact rule; together they never admit more than its
// limit, and Redis counts exactly what they admitted.
func TestExactRuleAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gateway processes against the real Redis")
	}
	prefix := testPrefix(t)
	c := testClient(t, "")
	const limit, procs = 500, 4
	cfg := childConfig{Addr: c.Options().Addr, Prefix: prefix, Limit: limit, Goroutines: 50, Attempts: 8,
		StartNs: time.Now().Add(2 * time.Second).UnixNano()}
	env, _ := json.Marshal(cfg)
	type out struct {
		res childResult
		err error
	}
	results := make(chan out, procs)
	for range procs {
		go func() {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+string(env))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			b, err := cmd.Output()
			if err != nil {
				results <- out{err: fmt.Errorf("%v: %s", err, stderr.String())}
				return
			}
			var r childResult
			if err := json.Unmarshal(b, &r); err != nil {
				results <- out{err: fmt.Errorf("child printed %q: %v", b, err)}
				return
			}
			results <- out{res: r}
		}()
	}
	var sum childResult
	for range procs {
		o := <-results
		if o.err != nil {
			t.Fatal(o.err)
		}
		sum.Allowed += o.res.Allowed
		sum.Refused += o.res.Refused
		sum.Unavailable += o.res.Unavailable
	}
	t.Logf("4 processes x 50 goroutines: %d allowed, %d refused, %d unavailable of %d attempts", sum.Allowed, sum.Refused, sum.Unavailable, procs*50*8)
	if sum.Allowed > limit {
		t.Fatalf("admitted %d requests past an exact limit of %d", sum.Allowed, limit)
	}
	if sum.Unavailable == 0 && sum.Allowed != limit {
		t.Fatalf("admitted %d of an exact limit of %d with 1600 attempts and Redis always answering", sum.Allowed, limit)
	}
	if got := windowUsed(t, c, sharedKey(prefix, exactRule(limit), Scope{})); got != sum.Allowed {
		t.Fatalf("Redis counts %d requests, the processes admitted %d", got, sum.Allowed)
	}
}
