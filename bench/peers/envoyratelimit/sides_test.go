package envoyratelimitbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/bench/sidebyside"
	"github.com/sluicehq/sluice/platform/itest"
)

// EnvoyRatelimitVersion is the version measured: the module proxy serves
// github.com/envoyproxy/ratelimit only as pseudo-versions of its main
// branch, no tagged release. It is built with its own go.mod (go install
// ...@version), as gubernator's daemon is, so that its dependencies stay
// the ones it was tested with.
const EnvoyRatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

// envoyDomain is the descriptor configuration's domain, and the descriptor
// keys of its three limits: the window of the open load and of the tight
// load (one configuration serves both, the service reading it once), and
// the bucket.
const (
	envoyDomain = "sluice_bench"
	openKey     = "open_window"
	tightKey    = "tight_window"
	bucketKey   = "bucket"
)

// envoyUnit is the service's unit for a window: its limits count in fixed
// windows of a second, minute, hour or day aligned to the clock, so only
// those windows can be asked of it.
func envoyUnit(b *testing.B, w time.Duration) string {
	b.Helper()
	switch w {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	case 24 * time.Hour:
		return "day"
	}
	b.Fatalf("the Envoy ratelimit service has no unit of %s", w)
	return ""
}

// envoyLimit is a limit as the service's requests_per_unit (a uint32): a
// limit above it, which never refuses, becomes its largest, which never
// refuses either at these loads.
func envoyLimit(n int64) int64 { return min(n, math.MaxUint32) }

// envoyConfig is the descriptor configuration: one limit per key value
// (descriptors without a value: each value gets its own counter), the
// open and tight windows as fixed windows of their rules' unit and limit,
// and the bucket, which the service cannot express (no token bucket), as
// what it can: a fixed one-minute window that never refuses, so that each
// decision still checks and counts two limits.
func envoyConfig(b *testing.B) string {
	b.Helper()
	var s strings.Builder
	fmt.Fprintf(&s, "domain: %s\ndescriptors:\n", envoyDomain)
	for _, d := range []struct {
		key   string
		limit int64
		unit  string
	}{
		{openKey, sidebyside.OpenRules.WindowLimit, envoyUnit(b, sidebyside.OpenRules.Window)},
		{tightKey, sidebyside.TightRules.WindowLimit, envoyUnit(b, sidebyside.TightRules.Window)},
		{bucketKey, sidebyside.BucketBurst, envoyUnit(b, sidebyside.BucketPeriod)},
	} {
		fmt.Fprintf(&s, "  - key: %s\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n", d.key, d.unit, envoyLimit(d.limit))
	}
	return s.String()
}

// envoyMode is one configuration of the service.
type envoyMode struct {
	name string
	// env is added to the common configuration.
	env []string
}

// envoyService starts the Envoy ratelimit service as its own process,
// configured as its README runs it locally (USE_STATSD=false,
// REDIS_SOCKET_TYPE=tcp, REDIS_URL, RUNTIME_ROOT, RUNTIME_SUBDIRECTORY,
// RUNTIME_APPDIRECTORY) with the services script's Redis, its keys under a
// prefix of their own (CACHE_KEY_PREFIX), gRPC, HTTP and debug ports on
// loopback, logs at warn, and the defaults otherwise (pool of 10 Redis
// connections, fixed-window Redis limiter, no local cache, no pipelining
// window). Its keys go when the benchmark ends.
func envoyService(b *testing.B, m envoyMode) envoyProcess {
	b.Helper()
	bin := sidebyside.PeerBinary(b, "envoy-ratelimit", "github.com/envoyproxy/ratelimit/src/service_cmd", EnvoyRatelimitVersion)
	rc, redisPid := sidebyside.SharedRedis(b, 2)
	root := b.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(envoyConfig(b)), 0o644); err != nil {
		b.Fatal(err)
	}
	grpcAddr := itest.FreeAddr(b)
	prefix := itest.Unique(b, "envoyrl:") + ":"
	b.Cleanup(func() { sidebyside.DeletePrefix(rc, prefix) })
	env := []string{"USE_STATSD=false", "LOG_LEVEL=warn",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rc.Options().Addr, "CACHE_KEY_PREFIX=" + prefix}
	for name, addr := range map[string]string{"GRPC_": grpcAddr, "": itest.FreeAddr(b), "DEBUG_": itest.FreeAddr(b)} {
		host, port, _ := strings.Cut(addr, ":")
		env = append(env, name+"HOST="+host, name+"PORT="+port)
	}
	proc := sidebyside.StartPeer(b, bin, append(env, m.env...)...)
	c, conn := envoyClient(b, grpcAddr)
	defer conn.Close()
	itest.EventuallyNoError(b, 30*time.Second, "the Envoy ratelimit service answering with its configuration", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, envoyRequest(openKey, "ready"))
		if err != nil {
			return err
		}
		if len(resp.Statuses) != 2 || resp.Statuses[0].CurrentLimit == nil || resp.Statuses[1].CurrentLimit == nil {
			return fmt.Errorf("no limit applied yet: %v", resp)
		}
		return nil
	})
	return envoyProcess{addr: grpcAddr, pids: []int{proc.Pid, redisPid}, redis: rc}
}

// envoyProcess is a running service: its gRPC address, the pids of the
// processes that decide (the service and Redis), and a client of its
// Redis.
type envoyProcess struct {
	addr  string
	pids  []int
	redis *redis.Client
}

func envoyClient(b *testing.B, addr string) (rls.RateLimitServiceClient, *grpc.ClientConn) {
	b.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	return rls.NewRateLimitServiceClient(conn), conn
}

// envoyRequest asks for one hit of key under the window named windowKey
// and the bucket: two descriptors, as an Envoy route with two rate-limit
// actions sends them.
func envoyRequest(windowKey, key string) *rls.RateLimitRequest {
	return &rls.RateLimitRequest{Domain: envoyDomain, HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: windowKey, Value: key}}},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: bucketKey, Value: key}}},
	}}
}

// envoySide sends each decision to the service as one ShouldRateLimit
// call of two descriptors, as Envoy's rate-limit filter does (gRPC, one
// connection): the window of the rules (the open or the tight one, which
// the configuration holds both of) and the bucket. Like gubernator's, and
// unlike Sluice's Admit, the two limits are not all-or-nothing: the
// service counts a hit in both counters whatever either answers
// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is off by default). Its answer
// names no window (a unit second's reset is always 1 s), so the overshoot
// reads the window from the load generator's clock.
func envoySide(b *testing.B, name string, p envoyProcess, ru sidebyside.Rules) sidebyside.Side {
	b.Helper()
	windowKey := openKey
	if ru == sidebyside.TightRules {
		windowKey = tightKey
	}
	c, conn := envoyClient(b, p.addr)
	b.Cleanup(func() { conn.Close() })
	scope := itest.Unique(b, "")
	return sidebyside.Side{
		Name: name, Servers: p.pids, Window: sidebyside.FixedAligned,
		Commands: func() int64 { return sidebyside.RedisCommands(p.redis) },
		Decide: func(ctx context.Context, k int) (bool, int64, bool, error) {
			resp, err := c.ShouldRateLimit(ctx, envoyRequest(windowKey, scope+sidebyside.KeyName(k)))
			if err != nil {
				return false, 0, false, err
			}
			if len(resp.Statuses) != 2 {
				return false, 0, false, errors.New("the Envoy ratelimit service answered " + strconv.Itoa(len(resp.Statuses)) + " of 2 descriptors")
			}
			return resp.OverallCode == rls.RateLimitResponse_OK, 0, false, nil
		},
	}
}
