package gubernatorbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// rules are the two limits every request is checked against, per key: a
// window of windowLimit requests per window, and a bucket that never
// refuses at these loads (its cost is what is measured).
type rules struct {
	windowLimit int64
	window      time.Duration
}

const (
	bucketBurst  = int64(1) << 40
	bucketPeriod = time.Minute // the bucket refills bucketBurst per bucketPeriod
)

func keyName(k int) string { return "key-" + strconv.Itoa(k) }

// sluiceSide is Sluice's admission over the shared Redis: one Limiter (one
// gateway), both rules a tenant's, exact or leased.
func sluiceSide(b *testing.B, name string, ru rules, exact bool, clients int) side {
	b.Helper()
	rc := itest.Redis(b)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true, PoolSize: clients + 2})
	b.Cleanup(func() { c.Close() })
	prefix := itest.Unique(b, "sluice:adm:") + ":"
	b.Cleanup(func() { deletePrefix(c, prefix) })
	l, err := admission.New(c, &admission.Rules{Default: admission.TenantRules{Rules: []admission.Rule{
		{Name: "window", Unit: admission.Requests, Algorithm: admission.SlidingWindow, Limit: ru.windowLimit, Window: ru.window, Exact: exact},
		{Name: "bucket", Unit: admission.Requests, Algorithm: admission.TokenBucket, Limit: bucketBurst,
			Rate: float64(bucketBurst) / bucketPeriod.Seconds(), Exact: exact},
	}}}, admission.WithPrefix(prefix), admission.WithMaxWait(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	pid, err := redisPid(c)
	if err != nil {
		b.Fatal(err)
	}
	return side{
		name: name, server: pid,
		commands: func() int64 { return redisCommands(c) },
		decide: func(ctx context.Context, k int) (bool, int64, bool, error) {
			tk, err := l.Admit(ctx, admission.Request{Tenant: keyName(k), Model: "m"})
			if err != nil {
				return false, 0, false, err
			}
			p := tk.Decision.Path
			return tk.Allowed(), 0, p == admission.PathLocal || p == admission.PathUnavailable, nil
		},
	}
}

func deletePrefix(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

// infoField is one field of a section of Redis's INFO.
func infoField(c *redis.Client, section, field string) (int64, error) {
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO %s has no %s", section, field)
}

// redisPid is the pid of the Redis c talks to, which runs on this machine
// (the services script's): its CPU is read from /proc.
func redisPid(c *redis.Client) (int, error) {
	pid, err := infoField(c, "server", "process_id")
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		return 0, fmt.Errorf("redis pid %d is not on this machine: %w", pid, err)
	}
	return int(pid), nil
}

func redisCommands(c *redis.Client) int64 {
	n, _ := infoField(c, "stats", "total_commands_processed")
	return n
}

// GubernatorVersion is the release measured, built from the module proxy
// with its own go.mod (go install ...@version): in this module its
// dependencies would be raised to Sluice's, and its daemon then fails at
// start (OpenTelemetry schema URLs in conflict).
const GubernatorVersion = "v2.13.0"

// gubernatorBinary builds gubernator's daemon once per version into the
// user's cache folder and returns its path.
func gubernatorBinary(b *testing.B) string {
	b.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(cache, "sluice-bench", "gubernator-"+GubernatorVersion)
	bin := filepath.Join(dir, "gubernator")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "github.com/gubernator-io/gubernator/v2/cmd/gubernator@"+GubernatorVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building gubernator %s: %v\n%s", GubernatorVersion, err, out)
	}
	return bin
}

// gubernatorDaemon starts one gubernator daemon, configured by its GUBER_
// environment as its README and example.conf say: gRPC and HTTP on
// loopback, member-list discovery with itself as the known node (a
// cluster of one), the default cache (50,000 limits) and workers (one per
// core), tracing off. It returns its gRPC address and pid.
func gubernatorDaemon(b *testing.B) (string, int) {
	b.Helper()
	bin := gubernatorBinary(b)
	grpcAddr, ml := itest.FreeAddr(b), itest.FreeAddr(b)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"GUBER_GRPC_ADDRESS="+grpcAddr, "GUBER_ADVERTISE_ADDRESS="+grpcAddr, "GUBER_HTTP_ADDRESS="+itest.FreeAddr(b),
		"GUBER_PEER_DISCOVERY_TYPE=member-list", "GUBER_MEMBERLIST_ADDRESS="+ml, "GUBER_MEMBERLIST_BIND_ADDRESS="+ml,
		"GUBER_MEMBERLIST_KNOWN_NODES="+ml, "GUBER_LOG_LEVEL=warn", "OTEL_TRACES_EXPORTER=none")
	log, err := os.Create(filepath.Join(b.TempDir(), "gubernator.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	c, err := guber.DialV1Server(grpcAddr, nil)
	if err != nil {
		b.Fatal(err)
	}
	itest.EventuallyNoError(b, 30*time.Second, "gubernator healthy with one peer", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h, err := c.HealthCheck(ctx, &guber.HealthCheckReq{})
		if err != nil {
			return err
		}
		if h.Status != "healthy" || h.PeerCount != 1 {
			return fmt.Errorf("status %q, %d peers", h.Status, h.PeerCount)
		}
		return nil
	})
	return grpcAddr, cmd.Process.Pid
}

// gubernatorSide sends each decision to the daemon as one GetRateLimits
// call of two limits: the window as gubernator's TOKEN_BUCKET (a count
// that resets duration after its first hit: a fixed window) and the bucket
// as its LEAKY_BUCKET (burst limit, leaking limit per duration). Unlike
// Sluice's Admit, the two are not all-or-nothing: a hit refused by one is
// still counted by the other.
func gubernatorSide(b *testing.B, name, addr string, pid int, ru rules, behavior guber.Behavior) side {
	b.Helper()
	c, err := guber.DialV1Server(addr, nil)
	if err != nil {
		b.Fatal(err)
	}
	scope := itest.Unique(b, "")
	return side{
		name: name, server: pid, fixedWindow: true,
		decide: func(ctx context.Context, k int) (bool, int64, bool, error) {
			key := scope + keyName(k)
			resp, err := c.GetRateLimits(ctx, &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{
				{Name: "window", UniqueKey: key, Hits: 1, Limit: ru.windowLimit, Duration: ru.window.Milliseconds(),
					Algorithm: guber.Algorithm_TOKEN_BUCKET, Behavior: behavior},
				{Name: "bucket", UniqueKey: key, Hits: 1, Limit: bucketBurst, Duration: bucketPeriod.Milliseconds(),
					Algorithm: guber.Algorithm_LEAKY_BUCKET, Behavior: behavior},
			}})
			if err != nil {
				return false, 0, false, err
			}
			if len(resp.Responses) != 2 {
				return false, 0, false, errors.New("gubernator answered " + strconv.Itoa(len(resp.Responses)) + " of 2 limits")
			}
			w, bk := resp.Responses[0], resp.Responses[1]
			if w.Error != "" || bk.Error != "" {
				return false, 0, false, errors.New(w.Error + bk.Error)
			}
			return w.Status == guber.Status_UNDER_LIMIT && bk.Status == guber.Status_UNDER_LIMIT, w.ResetTime, false, nil
		},
	}
}
